"""Labelled synthetic chest films: their anatomy, the findings schema, and held-out task evaluation.

Product code may use this package (the engine's accuracy gate, the benchmark, the case library); it depends only on
the contract (inference_api) and image I/O (xray_io).
"""
