"""A tiny, deterministic MedGemma-shaped checkpoint for demos and tests (random weights)."""

DEMO_MODEL_ID = "medgemma-xray-demo (random weights)"
