"""Which checkpoint a bundle was built from, and whether the PyTorch model being served is that checkpoint.

The build records one SHA-256 over the checkpoint's safetensors shards (model.weights_sha256). Serving a bundle of
another checkpoint beside PyTorch would answer from a different model than the breaker's fallback (and, for a
checkpoint with other weights, answer nonsense), so the runtime compares the two hashes before it opens anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

from medgemma_xray.engine_bundle.manifest import ManifestError, rebuild_command

_BLOCK = 1 << 20
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
    """Raise ModelMismatchError unless served_model's weights are the ones the bundle records."""
    served = Path(served_model)
    model = manifest.get("model", {})
    built = f"{model.get('id', 'an unknown model')} at {model.get('source_path', 'an unknown path')}"
    rebuild = re.sub(r"--model_path \S+", lambda _: f"--model_path {served}", rebuild_command(manifest))
    if not _shards(served):
        raise ModelMismatchError(
            f"the PyTorch model {served} has no *.safetensors weights (missing or not a checkpoint), so nothing "
            f"shows that the engine bundle {bundle_dir} (built from {built}) answers as it does. Set MODEL_PATH to "
            "the checkpoint the bundle was built from."
        )
    recorded = model.get("weights_sha256")
    actual = weights_sha256(served)
    if recorded != actual:
        raise ModelMismatchError(
            f"the engine bundle {bundle_dir} was built from another model than this server's PyTorch model "
            f"{served}: bundle from {built} (weights SHA-256 {str(recorded)[:16]}...), served "
            f"{_model_name(served)} (weights SHA-256 {actual[:16]}...). A bundle must serve the same model as "
            "PyTorch (the fallback answers from PyTorch). "
            f"Rebuild the bundle from the served model: {rebuild}; or set MODEL_PATH to {model.get('source_path')}."
        )
