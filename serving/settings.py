"""One typed settings object, read once from the environment and the command line."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL_DIR = REPO_ROOT / "models" / "medgemma-demo"
VALID_MODES = ("pytorch", "trt")


def _env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    """Every knob the server reads. Environment names are the field names upper-cased (MODEL_PATH, ...)."""

    model_path: Path | None = None  # None: the bundled demo checkpoint (random weights)
    engine_path: Path | None = None  # an engine bundle from optimize_trt_engine.py
    inference_mode: str = "pytorch"  # "pytorch" or "trt"
    device: str = "auto"  # "auto", "cpu" or "cuda"
    host: str = "127.0.0.1"
    port: int = 7860
    max_new_tokens: int = 300
    generation_concurrency: int = 2  # requests decoding at once; more queue
    queue_size: int = 64
    log_dir: Path = REPO_ROOT / "logs"
    control_socket: Path | None = None  # default: <log_dir>/control.sock
    keep_both_backends: bool = False  # keep the old backend loaded after a switch (needs memory for both)
    breaker_failures: int = 5  # consecutive TensorRT-path failures before falling back to PyTorch
    breaker_timeout_s: float = 120.0  # a TensorRT request slower than this counts as a failure
    # SIGTERM lets running answers finish for at most this long. The one copy of the number: stop_gradio.sh and
    # install_service.sh read it through `python -m serving.settings_cli get drain_timeout_s`.
    drain_timeout_s: int = 120
    instance_id: str = ""  # set per start by start_gradio.sh; /readyz returns it so the script knows who answered
    fault_injection: bool = False  # tests only: enables the control channel's fault switch

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> Settings:
        environ = dict(os.environ if environ is None else environ)
        values: dict = {}
        for spec in fields(cls):
            raw = environ.get(spec.name.upper())
            if raw is None or raw == "":
                continue
            values[spec.name] = _parse(spec.type, raw)
        settings = cls(**values)
        return settings.with_overrides(**overrides)

    def with_overrides(self, **overrides) -> Settings:
        return replace(self, **{key: value for key, value in overrides.items() if value is not None}).validated()

    def validated(self) -> Settings:
        if self.inference_mode not in VALID_MODES:
            raise ValueError(f"INFERENCE_MODE must be one of {', '.join(VALID_MODES)}, got {self.inference_mode!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"DEVICE must be auto, cpu or cuda, got {self.device!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"PORT must be 1..65535, got {self.port}")
        if not 1 <= self.drain_timeout_s <= 3600:
            raise ValueError(f"DRAIN_TIMEOUT_S must be 1..3600 seconds, got {self.drain_timeout_s}")
        if len(self.instance_id) > 64 or not all(c.isalnum() or c == "-" for c in self.instance_id):
            raise ValueError("INSTANCE_ID must be at most 64 letters, digits or '-'")
        return self

    @property
    def resolved_model_path(self) -> Path:
        return Path(self.model_path) if self.model_path else DEMO_MODEL_DIR

    @property
    def uses_demo_model(self) -> bool:
        return self.model_path is None

    @property
    def control_socket_path(self) -> Path:
        return Path(self.control_socket) if self.control_socket else Path(self.log_dir) / "control.sock"


def _parse(kind, raw: str):
    kind = str(kind)
    if "Path" in kind:
        return Path(raw)
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    if kind.startswith("bool"):
        return _env_bool(raw)
    return raw
