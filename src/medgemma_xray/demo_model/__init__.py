"""The demo checkpoint: a tiny MedGemma-shaped model trained on labelled phantoms (build, train, install).

Not a medical model. It exists so that the app, the engine build and the tests run end to end without the real
weights.
"""

DEMO_MODEL_ID = "medgemma-xray-demo (random weights)"
