"""Which precision can be built and verified where, decided before any work starts.

A precision is built only where some executor can run it for the accuracy check:
- the plans themselves, with the TensorRT executor, where the target's plans run on this host's GPU;
- otherwise the bundle's ONNX graphs in ONNX Runtime on the CPU: fp32 and int8 as they are, fp16 with
  ORT_ENABLE_EXTENDED (ORT_ENABLE_ALL's SimplifiedLayerNormFusion breaks on fp16 graphs). bf16 has no CPU
  kernels (Expand, among others), and fp8 on the CPU is an emulation that says nothing about FP8 plans, so both
  are built only where their plans run here, and refused up front elsewhere.
fp8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from medgemma_xray.engine_build.builder import FP8_RTX_COMPUTE_CAPABILITIES, RTX_COMPUTE_CAPABILITIES
from medgemma_xray.engine_bundle.names import TARGET_MODULES

PRECISIONS = ("int8", "fp8", "fp16", "bf16", "fp32")
# fp8 is not among them: ONNX Runtime's CPU emulation of FP8 Q/DQ says nothing about how FP8 plans run (FP8 GEMM
# kernels and their accumulation differ), so fp8 is built only where its plans run and are verified themselves.
ONNXRUNTIME_CPU_PRECISIONS = ("fp32", "int8", "fp16")
FP8_MIN_CAPABILITY = (8, 9)
BF16_MIN_CAPABILITY = (8, 0)


class PrecisionRefusedError(ValueError):
    """This precision cannot be built or verified with this target on this host; the message says what can."""


@dataclass(frozen=True)
class BuildPlan:
    precision: str
    target: str | None  # "tensorrt" | "tensorrt-rtx" | None (ONNX graphs only)
    compute_capabilities: tuple[str, ...]  # what TensorRT-RTX compiles for; () for other targets
    verify_executor: str  # "tensorrt" (the plans) | "onnxruntime-cpu" (the ONNX graphs)
    verify_reason: str  # why verification runs there, recorded in the manifest


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _sm(capability: tuple[int, int]) -> str:
    return f"SM{capability[0]}{capability[1]}"


def parse_compute_capabilities(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(part.strip().upper() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in RTX_COMPUTE_CAPABILITIES]
    if not names or unknown:
        raise PrecisionRefusedError(
            f"--compute_capabilities {text!r}: TensorRT-RTX targets {', '.join(RTX_COMPUTE_CAPABILITIES)} "
            f"(SM90, the H100/H200, is not an RTX target: use --target tensorrt there)"
        )
    return names


def _rtx_capabilities(precision: str, requested: tuple[str, ...] | None) -> tuple[str, ...]:
    if precision != "fp8":
        return requested or RTX_COMPUTE_CAPABILITIES
    if requested is None:
        return FP8_RTX_COMPUTE_CAPABILITIES
    too_old = [name for name in requested if name not in FP8_RTX_COMPUTE_CAPABILITIES]
    if too_old:
        raise PrecisionRefusedError(
            f"fp8 cannot run on {', '.join(too_old)}: FP8 needs compute capability 8.9 or newer "
            f"({', '.join(FP8_RTX_COMPUTE_CAPABILITIES)} for TensorRT-RTX). Build fp8 with --compute_capabilities "
            f"{','.join(FP8_RTX_COMPUTE_CAPABILITIES)}, or int8/fp16 for older GPUs."
        )
    return requested


def resolve_target(target: str) -> str | None:
    if target == "none":
        return None
    if target == "auto":
        return "tensorrt" if importlib.util.find_spec("tensorrt") else None
    if importlib.util.find_spec(TARGET_MODULES[target]) is None:
        raise PrecisionRefusedError(
            f"--target {target} needs the {TARGET_MODULES[target]} package, which is missing "
            f"(pip install {'tensorrt-cu13==11.4.0.106' if target == 'tensorrt' else 'tensorrt-rtx'})"
        )
    return target


def plan_build(
    precision: str,
    target: str,
    compute_capabilities: tuple[str, ...] | None,
    gpu: tuple[str, str] | None,
    why_no_gpu: str,
) -> BuildPlan:
    """Decide target, compute capabilities and the verifying executor; raise PrecisionRefusedError up front."""
    if precision not in PRECISIONS:
        raise PrecisionRefusedError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    resolved = resolve_target(target)
    if compute_capabilities is not None and resolved != "tensorrt-rtx":
        raise PrecisionRefusedError("--compute_capabilities is for --target tensorrt-rtx only")
    capabilities: tuple[str, ...] = ()
    plans_run_here = False
    if resolved == "tensorrt":
        if gpu is None:
            raise PrecisionRefusedError(
                f"--target tensorrt builds on the GPU it will run on, and this host has none: {why_no_gpu}. Build "
                "on the GPU host, or use --target none here and finish there with --from_onnx."
            )
        capability = _capability(gpu[1])
        if precision == "fp8" and capability < FP8_MIN_CAPABILITY:
            raise PrecisionRefusedError(
                f"fp8 cannot run on this GPU ({gpu[0]}, compute capability {gpu[1]}): FP8 needs 8.9 or newer "
                "(L40S, H100, H200, RTX 4090 and later). Build int8 or fp16 for it."
            )
        if precision == "bf16" and capability < BF16_MIN_CAPABILITY:
            raise PrecisionRefusedError(f"bf16 needs compute capability 8.0 or newer; {gpu[0]} has {gpu[1]}")
        plans_run_here = True
    elif resolved == "tensorrt-rtx":
        capabilities = _rtx_capabilities(precision, compute_capabilities)
        plans_run_here = gpu is not None and _sm(_capability(gpu[1])) in capabilities
    if plans_run_here:
        assert gpu is not None
        return BuildPlan(precision, resolved, capabilities, "tensorrt", f"the built plans, on this host's {gpu[0]}")
    if resolved is None:
        where = "no plans are built (--target none, or no TensorRT installed)"
    else:
        detail = why_no_gpu or f"this GPU ({gpu[0] if gpu else '?'}) is not among {', '.join(capabilities)}"
        where = f"TensorRT-RTX plans cannot run on this host: {detail}"
    reason = f"the bundle's ONNX graphs in ONNX Runtime on the CPU; {where}"
    if precision not in ONNXRUNTIME_CPU_PRECISIONS:
        why = (
            "ONNX Runtime's CPU provider only emulates FP8 Q/DQ, which says nothing about FP8 plans"
            if precision == "fp8"
            else f"ONNX Runtime's CPU provider has no {precision} kernels"
        )
        gpu_needed = "compute capability 8.9 or newer" if precision == "fp8" else "compute capability 8.0 or newer"
        raise PrecisionRefusedError(
            f"{precision} cannot be verified on this host: {why}, and {where}. Build {precision} on a GPU host "
            f"({gpu_needed}) with --target tensorrt, where the plans themselves are verified, or build fp16 or "
            "int8 here."
        )
    return BuildPlan(precision, resolved, capabilities, "onnxruntime-cpu", reason)
