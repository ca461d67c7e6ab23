"""MedGemma X-Ray assistant: chest-film questions, structured reports, teaching rounds and batch work on MedGemma.

Layers, lowest first (tests/test_layout.py enforces them; a package imports only from lower layers):
engine_bundle; inference_api, xray_io; phantoms, pytorch_backend, trt_inference, assistant; film_check;
serving, engine_build, demo_model, teaching; web; cli, scaleout. Nothing heavy loads at import time.
"""
