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
    fault_injection: bool = False  # tests only: enables the control channel's fault switch

    # --- security and limits (issue 7): uploads, login, per-request bounds -----------------------------------
    upload_cache_dir: Path | None = None  # this server's private Gradio cache; default <log_dir>/upload-cache
    max_file_size_mb: int = 64  # larger uploads are refused by Gradio's upload route (HTTP 413)
    max_pixels: int = 40_000_000  # rows x columns (x frames), checked from the header before decoding
    cache_max_age_s: int = 600  # previews and unread uploads older than this are deleted (Gradio's delete_cache)
    auth_file: Path | None = None  # login: "user:scrypt-hash" lines in a 0600 file (python -m serving.http_auth)
    max_turns: int = 20  # questions in one conversation; then the user starts a new case
    max_prompt_tokens: int = 1024  # tokens in one question, bounded by its UTF-8 bytes (no tokenizer call)
    request_timeout_s: float = 300.0  # an answer still streaming after this long is stopped

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
        for name in ("max_file_size_mb", "max_pixels", "cache_max_age_s", "max_turns", "max_prompt_tokens",
                     "request_timeout_s", "queue_size"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.upper()} must be positive, got {getattr(self, name)}")
        return self

    @property
    def resolved_model_path(self) -> Path:
        return Path(self.model_path) if self.model_path else DEMO_MODEL_DIR

    @property
    def uses_demo_model(self) -> bool:
        return self.model_path is None

    @property
    def upload_cache_path(self) -> Path:
        return Path(self.upload_cache_dir) if self.upload_cache_dir else Path(self.log_dir) / "upload-cache"

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size_mb << 20

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
