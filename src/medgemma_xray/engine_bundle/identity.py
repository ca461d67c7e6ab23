"""Which checkpoint a bundle was built from, and whether the PyTorch model being served is that checkpoint.

The build records one SHA-256 over the checkpoint's safetensors shards (model.weights_sha256) and one per file that
shapes what the model reads and says (model.files_sha256: config.json, the tokenizer, the chat template, the
processor and generation settings). Serving a bundle of another checkpoint beside PyTorch would answer from a
different model than the breaker's fallback: other weights answer nonsense, and an edited config.json or
tokenizer answers differently on the same film. So the runtime compares every hash before it opens anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import threading
from pathlib import Path
from typing import Any

from medgemma_xray.engine_bundle.manifest import ManifestError, rebuild_command

_BLOCK = 1 << 20
# The files beside the weights that change what the model reads or says; the build copies those it finds into the
# bundle (all but config.json, which the export bakes into the graphs) and records the hash of each.
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    "generation_config.json",
    "special_tokens_map.json",
)
IDENTITY_FILES = ("config.json", "tokenizer.model", *PROCESSOR_FILES)
# (folder, ((shard, bytes, mtime_ns), ...)) -> hash: the real checkpoint is 8.6 GB, hashed once per process.
_hash_cache: dict[tuple[Any, ...], str] = {}
_hash_lock = threading.Lock()


class ModelMismatchError(ManifestError):
    """The bundle was built from another checkpoint than the PyTorch model this server serves."""


def _shards(model_dir: Path) -> list[Path]:
    return sorted(Path(model_dir).glob("*.safetensors"))


def weights_sha256(model_dir: str | Path) -> str:
    """One hash over every safetensors shard, in name order: the engine manifest's record of the weights."""
    shards = _shards(Path(model_dir))
    key = (str(Path(model_dir).resolve()), tuple((s.name, s.stat().st_size, s.stat().st_mtime_ns) for s in shards))
    with _hash_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    digest = hashlib.sha256()
    for shard in shards:
        digest.update(shard.name.encode())
        with shard.open("rb") as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
    with _hash_lock:
        _hash_cache[key] = digest.hexdigest()
    return digest.hexdigest()


def model_files_sha256(model_dir: str | Path) -> dict[str, str]:
    """SHA-256 of each of IDENTITY_FILES that the checkpoint has, by name (the manifest's model.files_sha256)."""
    folder = Path(model_dir)
    hashes = {}
    for name in IDENTITY_FILES:
        path = folder / name
        if path.is_file():
            hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def rebuild_from(manifest: dict[str, Any], served: Path) -> str:
    """The command that rebuilds this bundle from the served checkpoint: the recorded build with its --model_path
    set to `served` (added where the build took the default demo checkpoint)."""
    command = rebuild_command(manifest)
    model = f"--model_path {shlex.quote(str(served))}"
    replaced, count = re.subn(r"--model_path(?:=|\s+)\S+", lambda _: model, command, count=1)
    if count:
        return replaced
    program = r"(optimize_trt_engine\.py|medgemma-xray-build-engine)"
    return re.sub(program, lambda found: f"{found.group(1)} {model}", command, count=1)


def _model_name(model_dir: Path) -> str:
    """The served checkpoint in words: its demo marker's id or config's name, and its folder."""
    marker = model_dir / "demo_checkpoint.json"
    name = ""
    try:
        if marker.is_file():
            name = json.loads(marker.read_text()).get("model_id", "")
        if not name and (model_dir / "config.json").is_file():
            name = json.loads((model_dir / "config.json").read_text()).get("_name_or_path", "")
    except (OSError, ValueError):
        name = ""
    return f"{name} at {model_dir}" if name else str(model_dir)


def check_model_identity(bundle_dir: Path, manifest: dict[str, Any], served_model: str | Path) -> None:
    """Raise ModelMismatchError unless served_model's weights, config, tokenizer and processor files are the ones
    the bundle records."""
    served = Path(served_model)
    model = manifest.get("model", {})
    built = f"{model.get('id', 'an unknown model')} at {model.get('source_path', 'an unknown path')}"
    rebuild = rebuild_from(manifest, served)
    if not _shards(served):
        raise ModelMismatchError(
            f"the PyTorch model {served} has no *.safetensors weights (missing or not a checkpoint), so nothing "
            f"shows that the engine bundle {bundle_dir} (built from {built}) answers as it does. Set MODEL_PATH to "
            "the checkpoint the bundle was built from."
        )
    recorded = model.get("weights_sha256")
    actual = weights_sha256(served)
    same_model = (
        "A bundle must serve the same model as PyTorch (the fallback answers from PyTorch). "
        f"Rebuild the bundle from the served model: {rebuild}; or set MODEL_PATH to {model.get('source_path')}."
    )
    if recorded != actual:
        raise ModelMismatchError(
            f"the engine bundle {bundle_dir} was built from another model than this server's PyTorch model "
            f"{served}: bundle from {built} (weights SHA-256 {str(recorded)[:16]}...), served "
            f"{_model_name(served)} (weights SHA-256 {actual[:16]}...). {same_model}"
        )
    recorded_files = model.get("files_sha256")
    if not isinstance(recorded_files, dict):
        raise ModelMismatchError(
            f"the engine bundle {bundle_dir} records the hash of its model's weights only, not of its config.json, "
            f"tokenizer and processor files (a bundle from an older build), so nothing shows that {served} reads "
            f"and answers as the model it was built from. Rebuild it: {rebuild}"
        )
    served_files = model_files_sha256(served)
    differ = sorted(
        name for name in set(recorded_files) | set(served_files) if recorded_files.get(name) != served_files.get(name)
    )
    if differ:
        described = ", ".join(f"{name} {_how_it_differs(name, recorded_files, served_files)}" for name in differ)
        raise ModelMismatchError(
            f"the engine bundle {bundle_dir} was built from another version of this server's PyTorch model "
            f"{served}: the weights match, but {described} since the build from {built}. The bundle and PyTorch "
            f"would read or answer differently. {same_model}"
        )


def _how_it_differs(name: str, recorded: dict[str, str], served: dict[str, str]) -> str:
    if name not in served:
        return "is missing from the served model"
    if name not in recorded:
        return "was added to the served model"
    return f"changed (SHA-256 {served[name][:16]}..., recorded {recorded[name][:16]}...)"
