"""Every knob of the server in one typed object, read once from the environment and the command line.

Environment names are the field names upper-cased (MODEL_PATH, DRAIN_TIMEOUT_S, ...). The operator scripts read
the values they need through this module's CLI, never from copies:

    python -m medgemma_xray.serving.settings get drain_timeout_s      # one value, after the environment is applied
    python -m medgemma_xray.serving.settings show                     # all of them, as JSON
    python -m medgemma_xray.serving.settings get host --env-file /etc/default/medgemma-xray   # as the systemd unit will see it
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import types
import typing
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from medgemma_xray.engine_bundle.checkpoint_profile import CHECKPOINT_CHOICES
from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS, FAST_PATH_WEIGHT_FORMATS
from medgemma_xray.inference_api.types import DEFAULT_MAX_NEW_TOKENS, MAX_MAX_NEW_TOKENS, Mode


def _project_home() -> Path:
    """Where models/ and logs/ are by default: the checkout this package is installed from (editable, src layout),
    else the working directory (an image installs the package into site-packages and runs from its app folder)."""
    checkout = Path(__file__).resolve().parents[3]
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


REPO_ROOT = _project_home()
DEMO_MODEL_DIR = REPO_ROOT / "models" / "medgemma-demo"
FILM_CHECK_MODES = ("refuse", "warn", "off")
TORCH_PATHS = ("auto", "eager", "fast")
DEVICES = ("auto", "cpu", "cuda")


class SettingsError(ValueError):
    """A setting has a value the server cannot use; the message names the variable and the valid values."""


@dataclass(frozen=True)
class Settings:
    # --- what to serve ---
    model_path: Path | None = None  # None: the bundled demo checkpoint
    engine_path: Path | None = None  # an engine bundle from optimize_trt_engine.py
    inference_mode: Mode = Mode.PYTORCH
    # Serve an engine bundle on an executor its accuracy was never measured on (TensorRT plans built with
    # --from_onnx, or a GPU-verified bundle on a CPU host). Every status line and the UI then say so.
    allow_unverified_plans: bool = False
    device: str = "auto"  # auto, cpu or cuda
    torch_path: str = "auto"  # eager (the reference), fast (static cache + CUDA graphs), auto: fast on CUDA
    # Which checkpoint MODEL_PATH holds, where its files do not say (engine_bundle/checkpoint_profile): auto,
    # medgemma-1.5-4b-it (localises findings, compares with a prior), medgemma-4b-it (neither), or other (neither).
    model_checkpoint: str = "auto"
    # --- where ---
    host: str = "127.0.0.1"
    port: int = 7860
    log_dir: Path = REPO_ROOT / "logs"
    control_socket: Path | None = None  # default: <log_dir>/control.sock
    # --- limits ---
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    generation_concurrency: int = 2  # answers decoded together (one batch); more wait in the queue
    queue_size: int = 64  # answers waiting for a decode slot before new ones are turned away as busy
    max_resident_conversations: int = (
        DEFAULT_MAX_RESIDENT_CONVERSATIONS  # conversations whose KV cache stays between turns (LRU beyond)
    )
    max_sequence: int = 4096  # the fast path's static KV cache: longest conversation plus answer, in tokens
    fast_path_weights: str = "bf16"  # bf16, int8 or fp8: the fast path's decode weights (8-bit: gated at start)
    fast_path_fused_step: bool = False  # the decode step with the KV write inside the attention kernel
    # --- caches shared across users and the per-step token budget ---
    prefix_cache_gib: float = 1.0  # the fast path's pool of prefix KV blocks (the film's tokens, shared); 0: off
    image_cache_gib: float = 0.5  # the vision tower's output per film (content hash), least recently used evicted
    max_batched_tokens: int = 2048  # tokens per scheduler step: decode tokens plus prompt chunks
    request_timeout_s: float = 300.0  # longest one answer may take, waiting included
    # --- hot switch, breaker, shutdown ---
    keep_both_backends: bool = False  # keep TensorRT loaded after switching back to PyTorch
    breaker_failures: int = 5  # consecutive TensorRT failures before falling back to PyTorch
    breaker_timeout_s: float = 120.0  # a TensorRT answer not finished this long after it started is a failure
    drain_timeout_s: float = 120.0  # on SIGTERM, how long running answers may take to finish
    # --- this start ---
    instance_id: str = ""  # set per start by start_gradio.sh; /readyz returns it so the script knows who answered
    # --- security and input limits: uploads, login, conversation bounds ---
    upload_cache_dir: Path | None = None  # this server's private Gradio cache; default <log_dir>/upload-cache
    max_file_size_mb: int = 64  # larger uploads are refused by Gradio's upload route (HTTP 413)
    max_pixels: int = 40_000_000  # rows x columns (x frames), checked from the header before decoding
    cache_max_age_s: int = 600  # previews and unread uploads older than this are deleted (Gradio's delete_cache)
    auth_file: Path | None = (
        None  # login: "user:scrypt-hash" lines in a 0600 file (python -m medgemma_xray.web.http_auth)
    )
    max_turns: int = 20  # questions in one conversation; then the user starts a new case
    max_prompt_tokens: int = 2048  # tokens in one question, bounded by its UTF-8 bytes (no tokenizer call); room
    #   for MedGemma 1.5's localisation prompt as Google's notebook writes it (1,063 bytes)
    questions_per_minute: int = 0  # questions and reports one client (login name, else address) may start a
    #   minute, at every door (web/asking.py); 0: no throttling
    # --- teaching rounds (web/teaching_page.py) ---
    case_library: Path | None = None  # folder of cases (docs/teaching_cases.md); default <log_dir>/case-library
    sr_include_identifiers: bool = False  # let users put the source film's patient/study into a DICOM SR export
    teaching_questions_before_reveal: bool = False  # quiz mode answers questions before the reveal (guess first off)
    # --- hostile clients: sessions, connections, uploads, memory ---
    session_ttl_s: float = 1800.0  # a session's case is dropped this long after its last change (API clients
    #   send no heartbeat, so an idle session is otherwise kept until the capacity evicts it)
    session_capacity: int = 1000  # sessions whose state is held at once; the least recently used go first
    header_timeout_s: float = 10.0  # a connection must finish its request headers within this, or it is closed
    # An idle keep-alive connection is closed after this (uvicorn). Longer than clients keep idle connections in
    # their pools (httpx and so the openai client 5 s, aiohttp 15 s): at uvicorn's own 5 s, a client reused a
    # connection the server was closing at that instant, and its request failed unseen.
    keep_alive_timeout_s: int = 20
    max_connections: int = 2048  # open connections plus running requests; beyond it uvicorn answers 503 at once
    per_client_connections: int = 256  # connections one client address may hold; its next ones get 503
    body_timeout_s: float = 30.0  # a request body must arrive within this plus 1 s per 64 KiB, or it gets 408
    max_files_per_request: int = 4  # files in one call to the upload route (the UI sends one)
    upload_cache_max_mb: int = 512  # bytes kept in the upload cache at once; an upload past it is refused (507)
    upload_max_age_s: int = 120  # an upload nobody read within this is deleted (the UI reads it at once)
    memory_max_mb: int = 0  # the systemd unit's MemoryMax (MemoryHigh at 90%); 0: no limit
    log_repeats_per_minute: int = 120  # records from one log call kept per minute beyond a burst; the rest are
    #   counted and summarised, so a flood cannot rotate earlier lines away
    # --- the film check: is an upload plausibly a frontal chest film? (film_check/) ---
    film_check: str = "refuse"  # refuse | warn (read it, with a warning in the film's notes) | off
    film_check_reference: Path | None = None  # a reference fitted on the site's own films; default: the phantoms'
    # --- the film intake (intake/): one decoded-film cache and one bound on decodes, for every door ---
    film_cache_mb: int = 512  # decoded films kept by content hash (model images; /teaching's full-resolution values)
    film_decodes: int = 2  # films decoded at once in the whole server; more wait their turn
    film_decode_timeout_s: float = 30.0  # each decode runs in a worker process, killed past this; 0: in-process

    def __post_init__(self) -> None:
        if not isinstance(self.inference_mode, Mode):  # Settings(inference_mode="trt") in code and tests
            try:
                object.__setattr__(self, "inference_mode", Mode.parse(self.inference_mode))
            except ValueError as exc:
                raise SettingsError(f"INFERENCE_MODE: {exc}") from None

    @classmethod
    def from_env(cls, environ: typing.Mapping[str, str] | None = None, **overrides) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict = {}
        hints = typing.get_type_hints(cls)
        for spec in fields(cls):
            raw = environ.get(spec.name.upper())
            if raw is not None and raw != "":
                values[spec.name] = _parse(spec.name, hints[spec.name], raw)
        return cls(**values).with_overrides(**overrides)

    def with_overrides(self, **overrides) -> Settings:
        hints = typing.get_type_hints(type(self))
        parsed = {
            key: _parse(key, hints[key], value) if isinstance(value, str) else value
            for key, value in overrides.items()
            if value is not None
        }
        return replace(self, **parsed).validated()

    def validated(self) -> Settings:
        _one_of("DEVICE", self.device, DEVICES)
        _one_of("TORCH_PATH", self.torch_path, TORCH_PATHS)
        _one_of("MODEL_CHECKPOINT", self.model_checkpoint, CHECKPOINT_CHOICES)
        _one_of("FAST_PATH_WEIGHTS", self.fast_path_weights, FAST_PATH_WEIGHT_FORMATS)
        _in_range("PORT", self.port, 1, 65535)
        _in_range("MAX_NEW_TOKENS", self.max_new_tokens, 1, MAX_MAX_NEW_TOKENS)
        _in_range("GENERATION_CONCURRENCY", self.generation_concurrency, 1, 256)
        _in_range("QUEUE_SIZE", self.queue_size, 1, 10_000)
        _in_range("MAX_RESIDENT_CONVERSATIONS", self.max_resident_conversations, 0, 4096)
        _in_range("MAX_SEQUENCE", self.max_sequence, 512, 131_072)
        _in_range("PREFIX_CACHE_GIB", self.prefix_cache_gib, 0, 1024)
        _in_range("IMAGE_CACHE_GIB", self.image_cache_gib, 0, 1024)
        _in_range("MAX_BATCHED_TOKENS", self.max_batched_tokens, 256, 1_000_000)
        _in_range("BREAKER_FAILURES", self.breaker_failures, 1, 1000)
        for name in ("request_timeout_s", "breaker_timeout_s", "drain_timeout_s"):
            _in_range(name.upper(), getattr(self, name), 0.1, 86_400)
        if len(self.instance_id) > 64 or not all(c.isalnum() or c == "-" for c in self.instance_id):
            raise SettingsError("INSTANCE_ID must be at most 64 letters, digits or '-'")
        _in_range("MAX_FILE_SIZE_MB", self.max_file_size_mb, 1, 4096)
        _in_range("MAX_PIXELS", self.max_pixels, 1_000_000, 1_000_000_000)
        _in_range("CACHE_MAX_AGE_S", self.cache_max_age_s, 10, 86_400)
        _in_range("MAX_TURNS", self.max_turns, 1, 1000)
        _in_range("MAX_PROMPT_TOKENS", self.max_prompt_tokens, 16, 1_000_000)
        _in_range("QUESTIONS_PER_MINUTE", self.questions_per_minute, 0, 1_000_000)
        _in_range("SESSION_TTL_S", self.session_ttl_s, 10, 7 * 86_400)
        _in_range("SESSION_CAPACITY", self.session_capacity, 10, 100_000)
        _in_range("HEADER_TIMEOUT_S", self.header_timeout_s, 1, 600)
        _in_range("KEEP_ALIVE_TIMEOUT_S", self.keep_alive_timeout_s, 1, 600)
        _in_range("MAX_CONNECTIONS", self.max_connections, 16, 1_000_000)
        _in_range("PER_CLIENT_CONNECTIONS", self.per_client_connections, 4, self.max_connections)
        _in_range("BODY_TIMEOUT_S", self.body_timeout_s, 1, 3600)
        _in_range("MAX_FILES_PER_REQUEST", self.max_files_per_request, 1, 1000)
        _in_range("UPLOAD_CACHE_MAX_MB", self.upload_cache_max_mb, 16, 1 << 20)
        _in_range("UPLOAD_MAX_AGE_S", self.upload_max_age_s, 10, 86_400)
        _in_range("MEMORY_MAX_MB", self.memory_max_mb, 0, 1 << 24)
        if 0 < self.memory_max_mb < 2048:
            raise SettingsError(f"MEMORY_MAX_MB must be 0 (no limit) or at least 2048, got {self.memory_max_mb}")
        _in_range("LOG_REPEATS_PER_MINUTE", self.log_repeats_per_minute, 1, 1_000_000)
        _one_of("FILM_CHECK", self.film_check, FILM_CHECK_MODES)
        _in_range("FILM_CACHE_MB", self.film_cache_mb, 0, 1 << 20)
        _in_range("FILM_DECODES", self.film_decodes, 1, 256)
        _in_range("FILM_DECODE_TIMEOUT_S", self.film_decode_timeout_s, 0, 3600)
        return self

    @property
    def resolved_model_path(self) -> Path:
        return Path(self.model_path) if self.model_path else DEMO_MODEL_DIR

    @property
    def control_socket_path(self) -> Path:
        return Path(self.control_socket) if self.control_socket else Path(self.log_dir) / "control.sock"

    @property
    def upload_cache_path(self) -> Path:
        return Path(self.upload_cache_dir) if self.upload_cache_dir else Path(self.log_dir) / "upload-cache"

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size_mb << 20

    @property
    def kv_slots(self) -> int:
        """Conversations a backend holds at once: those decoding plus those kept between turns."""
        return self.generation_concurrency + self.max_resident_conversations

    def as_dict(self) -> dict:
        return {key: (str(value) if isinstance(value, (Path, Mode)) else value) for key, value in asdict(self).items()}


def _parse(name: str, kind, raw: str):
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    try:
        if kind is bool:
            if raw.strip().lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(raw)
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if kind is Mode:
            return Mode.parse(raw)
        return kind(raw)
    except ValueError as exc:
        raise SettingsError(f"{name.upper()}={raw!r} is not a valid {getattr(kind, '__name__', kind)}: {exc}") from None


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise SettingsError(f"{name} must be one of {', '.join(valid)}, got {value!r}")


def _in_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SettingsError(f"{name} must be in {low:g}..{high:g}, got {value:g}")


def read_environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (blank lines and # or ; comments skipped, values
    optionally quoted), so install_service.sh sizes the unit from the values the service will really get."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, separator, raw = line.partition("=")
        if not separator or not key.strip().isidentifier():
            raise SettingsError(f"{path}:{number}: expected KEY=VALUE")
        values[key.strip()] = " ".join(shlex.split(raw)) if raw.strip() else ""
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the server's settings as the environment makes them.")
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("get", help="one setting's value")
    get.add_argument("name", choices=[spec.name for spec in fields(Settings)])
    show = commands.add_parser("show", help="every setting, as JSON")
    for command in (get, show):
        command.add_argument(
            "--env-file", type=Path, help="also apply this systemd EnvironmentFile, which wins over the environment"
        )
    args = parser.parse_args(argv)
    try:
        environ = dict(os.environ)
        if args.env_file is not None and args.env_file.exists():
            environ.update(read_environment_file(args.env_file))
        settings = Settings.from_env(environ)
    except (SettingsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    values = settings.as_dict()
    if args.command == "get":  # an unset value prints as an empty line, never "None", for the shell scripts
        print("" if values[args.name] is None else values[args.name])
    else:
        print(json.dumps(values, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
