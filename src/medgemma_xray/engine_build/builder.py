"""TensorRT / TensorRT-RTX engine builds from ONNX (Polygraphy's split: this builds, the runtime runs).

Networks are strongly typed: precision comes from the ONNX itself (Q/DQ nodes from ModelOpt, or AutoCast
casts), as TensorRT 11 removed implicit INT8 calibration and the FP16/INT8 builder flags.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medgemma_xray.engine_bundle.names import KV_KINDS, TARGET_MODULES, past_name

logger = logging.getLogger(__name__)

# SM75 (Turing) is left out: TensorRT-RTX has no FP32 GEMM there, and our fp32 graphs need one.
RTX_COMPUTE_CAPABILITIES = ("SM80", "SM86", "SM89", "SM120")
# FP8 (e4m3) tensor cores: Ada (SM89) and newer. TensorRT-RTX refuses to compile fp8 for SM80/SM86.
FP8_RTX_COMPUTE_CAPABILITIES = ("SM89", "SM120")


class EngineBuildError(RuntimeError):
    """The ONNX parser or the builder refused a graph; the message carries every parser error and the log."""


@dataclass(frozen=True)
class Profile:
    """min/opt/max shapes per dynamic input."""

    shapes: dict[str, tuple[tuple[int, ...], ...]]  # (min, opt, max) per input


class EngineBuilder:
    def __init__(
        self,
        target: str,
        workspace_gib: float = 8.0,
        timing_cache: Path | None = None,
        compute_capabilities: tuple[str, ...] = RTX_COMPUTE_CAPABILITIES,
    ) -> None:
        if target not in TARGET_MODULES:
            raise ValueError(f"unknown target {target!r}; valid: {', '.join(TARGET_MODULES)}")
        self.target = target
        self.trt: Any = importlib.import_module(TARGET_MODULES[target])  # TensorRT or TensorRT-RTX, as chosen
        self.workspace_bytes = int(workspace_gib * (1 << 30))
        # TensorRT times kernels on the GPU it builds on, so its cache pays off between builds. TensorRT-RTX builds
        # ahead of time, often on a host with no GPU, where creating a cache only logs CUDA errors.
        self.timing_cache = timing_cache if target == "tensorrt" else None
        self.compute_capabilities = tuple(compute_capabilities)
        self.log_lines: list[str] = []
        trt = self.trt
        errors = (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR)

        class _Logger(trt.ILogger):  # type: ignore[name-defined]  # a module chosen at run time (self.trt)
            def __init__(inner) -> None:
                trt.ILogger.__init__(inner)

            def log(inner, severity, message) -> None:
                if severity <= trt.ILogger.Severity.INFO:
                    self.log_lines.append(f"[{severity}] {message}")
                if severity in errors:
                    logger.error("%s: %s", target, message)
                elif severity == trt.ILogger.Severity.WARNING:
                    logger.warning("%s: %s", target, message)

        self.logger = _Logger()

    @property
    def version(self) -> str:
        return self.trt.__version__

    def build(self, onnx_path: Path, engine_path: Path, profile: Profile) -> float:
        """Parse onnx_path, build with one optimization profile, write engine_path. Returns seconds taken."""
        trt = self.trt
        started = time.perf_counter()
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)  # always strongly typed in TensorRT 11 and TensorRT-RTX
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = [str(parser.get_error(index)) for index in range(parser.num_errors)]
            raise EngineBuildError(f"{self.target} could not parse {onnx_path}:\n" + "\n".join(errors))
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        if self.target == "tensorrt-rtx":
            # Ahead-of-time build on any host (a GPU is not needed) for the RTX generations TensorRT-RTX supports.
            config.num_compute_capabilities = len(self.compute_capabilities)
            for index, name in enumerate(self.compute_capabilities):
                config.set_compute_capability(getattr(trt.ComputeCapability, name), index)
        cache = None
        if self.timing_cache is not None and hasattr(config, "create_timing_cache"):
            blob = self.timing_cache.read_bytes() if self.timing_cache.is_file() else b""
            cache = config.create_timing_cache(blob)
            config.set_timing_cache(cache, ignore_mismatch=False)
        optimization_profile = builder.create_optimization_profile()
        for name, (low, best, high) in profile.shapes.items():
            optimization_profile.set_shape(name, low, best, high)
        config.add_optimization_profile(optimization_profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineBuildError(
                f"{self.target} failed to build {onnx_path}. Last log lines:\n" + "\n".join(self.log_lines[-30:])
            )
        from medgemma_xray.engine_build.staging import write_bytes_atomically

        write_bytes_atomically(engine_path, bytes(serialized))
        if cache is not None and self.timing_cache is not None:  # (cache exists only with a timing_cache)
            write_bytes_atomically(self.timing_cache, bytes(cache.serialize()))
        elapsed = time.perf_counter() - started
        logger.info("%s built %s -> %s in %.1f s", self.target, onnx_path.name, engine_path.name, elapsed)
        return elapsed


def graph_profiles(shapes: dict) -> dict[str, Profile]:
    """Optimization profiles for the three graphs from the manifest's shapes (batch range, max sequence).

    The decoder's past is the KV cache at its capacity (engine_bundle/kv_layout.py): up to max_seq + 1 rows (the
    dead slot included). The profile is self-consistent: TensorRT checks that past + new == total holds at kMIN,
    kOPT and kMAX, so total's maximum is past's maximum plus new's maximum, not max_seq + 1. The runtime sends at
    most capacity + new keys, capacity < 1 + past + KV_BLOCK; the executor's buffers are sized for that.
    """
    from medgemma_xray.engine_bundle.kv_layout import capacity_for

    batch, max_batch = 1, shapes["max_batch"]
    image, hidden, tokens = shapes["image_size"], shapes["hidden"], shapes["image_tokens"]
    max_seq = shapes["max_sequence"]
    typical_prompt = min(max_seq, tokens + 64)
    kv = (shapes["kv_heads"], shapes["head_dim"])
    vision = Profile(
        {"pixel_values": ((batch, 3, image, image), (batch, 3, image, image), (max_batch, 3, image, image))}
    )
    embed = Profile({"input_ids": ((1, 1), (1, typical_prompt), (1, max_seq))})
    new = (1, 1, max_seq)
    past = (1, capacity_for(1 + typical_prompt, max_seq + 1), max_seq + 1)  # capacities, the dead slot included
    total = tuple(n + p for n, p in zip(new, past, strict=True))
    decoder_shapes = {
        "inputs_embeds": tuple((1, n, hidden) for n in new),
        "position_ids": tuple((1, n) for n in new),
        "full_mask": tuple((1, 1, n, t) for n, t in zip(new, total, strict=True)),
        "sliding_mask": tuple((1, 1, n, t) for n, t in zip(new, total, strict=True)),
    }
    for layer in range(shapes["layers"]):
        for kind in KV_KINDS:
            decoder_shapes[past_name(kind, layer)] = tuple((1, kv[0], p, kv[1]) for p in past)
    return {"vision": vision, "embed": embed, "decoder": Profile(decoder_shapes)}
