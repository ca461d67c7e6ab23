"""Exported graphs against PyTorch in ONNX Runtime, on prefill and decode shapes, before anything else runs."""

from __future__ import annotations

import numpy as np
import torch

from medgemma_xray.engine_build.graphs import DecoderGraph, DecoderShape, EmbedGraph, VisionGraph, sample_decoder_inputs


class ParityError(RuntimeError):
    """An exported graph disagrees with PyTorch beyond the tolerance; the message has the figures."""


def _max_relative_error(reference: np.ndarray, produced: np.ndarray) -> float:
    scale = float(np.abs(reference).max())
    if scale == 0.0:  # e.g. transformers' zero-initialised projector: equal zeros would prove nothing
        raise ParityError("the PyTorch reference output is all zeros; the comparison would prove nothing")
    return float(np.abs(reference - produced).max()) / scale


def check_export_parity(
    model,
    onnx_dir,
    pixel_values: torch.Tensor,
    tolerance: float = 1e-3,
    providers=None,
    graphs=("vision", "embed", "decoder"),
) -> dict:
    """Max error relative to each output's largest magnitude, per graph and shape. Raises ParityError if above."""
    import onnxruntime as ort

    providers = providers or ["CPUExecutionProvider"]
    device = next(model.parameters()).device
    shape = DecoderShape.from_config(model.config)
    figures: dict[str, float] = {}

    def session(name):
        return ort.InferenceSession(str(onnx_dir / f"{name}.onnx"), providers=providers)

    with torch.inference_mode():
        if "vision" in graphs:
            figures.update(_vision_parity(model, session, pixel_values, device))
        if "embed" in graphs:
            ids = torch.tensor([[2, 4, 5, 6, 7, 8, 9, 10]], dtype=torch.long)
            expected = EmbedGraph(model)(ids.to(device)).float().cpu().numpy()
            figures["embed"] = _max_relative_error(expected, session("embed").run(None, {"input_ids": ids.numpy()})[0])
        if "decoder" in graphs:
            figures.update(_decoder_parity(model, session, shape, device))
    worst = max(figures, key=figures.__getitem__)
    if figures[worst] > tolerance:
        raise ParityError(
            f"ONNX export disagrees with PyTorch: {worst} max relative error {figures[worst]:.2e} > {tolerance:.0e}. "
            f"All figures: { {k: f'{v:.2e}' for k, v in figures.items()} }"
        )
    return figures


def _vision_parity(model, session, pixel_values, device) -> dict:
    vision = session("vision")
    expected = VisionGraph(model)(pixel_values.to(device)).float().cpu().numpy()
    produced = vision.run(None, {"pixel_values": pixel_values.float().cpu().numpy()})[0]
    return {"vision": _max_relative_error(expected, produced)}


def _decoder_parity(model, session, shape, device) -> dict:
    figures = {}
    decoder = session("decoder")
    decoder_module = DecoderGraph(model)
    dtype = next(model.parameters()).dtype
    for label, new, past in (("decoder_prefill", 300, 1), ("decoder_step", 1, 301)):
        inputs = sample_decoder_inputs(shape, batch=1, new=new, past=past, dtype=dtype)
        expected = decoder_module(*[value.to(device) for value in inputs.values()])
        feeds = {
            name: value.float().numpy() if value.is_floating_point() else value.numpy()
            for name, value in inputs.items()
        }
        produced = decoder.run(None, feeds)
        figures[f"{label}_logits"] = _max_relative_error(expected[0].float().cpu().numpy(), produced[0])
        figures[f"{label}_kv"] = max(
            _max_relative_error(e.float().cpu().numpy(), p) for e, p in zip(expected[1:], produced[1:], strict=True)
        )
    return figures
