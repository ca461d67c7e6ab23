"""What a model directory is: its id, whether it is the demo, and a fingerprint of its weights. No torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from medgemma_xray.engine_bundle.checkpoint_profile import CheckpointProfile, checkpoint_profile
from medgemma_xray.engine_bundle.defaults import DEMO_NOTICE
from medgemma_xray.engine_bundle.identity import weights_sha256  # noqa: F401 (one hash rule, shared with the runtime)

DEMO_MARKER = "demo_checkpoint.json"


@dataclass(frozen=True)
class CheckpointDescription:
    path: Path
    model_id: str
    is_demo: bool
    demo_notice: str | None = None  # what the demo model is, from its marker; None for a real checkpoint
    # Which checkpoint it is and what it can do (localisation, longitudinal): engine_bundle/checkpoint_profile.
    profile: CheckpointProfile = CheckpointProfile("", "", frozenset(), "")


class CheckpointError(ValueError):
    """The model directory is missing or is not a Gemma 3 / MedGemma checkpoint."""


def describe_checkpoint(model_dir: str | Path, checkpoint: str = "auto") -> CheckpointDescription:
    """checkpoint: MODEL_CHECKPOINT, the operator's word on which checkpoint this is where its files do not say."""
    model_dir = Path(model_dir)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{model_dir} is not a model directory (no config.json). Point MODEL_PATH (or --model_path) at a "
            "local download of google/medgemma-4b-it, or leave it unset to use the demo checkpoint (which "
            "scripts/setup_env.sh writes to models/medgemma-demo)."
        )
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "gemma3":
        raise CheckpointError(
            f"{model_dir}: model_type is {config.get('model_type')!r}, expected 'gemma3' (MedGemma 4B is a Gemma 3 model)."
        )
    marker = model_dir / DEMO_MARKER
    if marker.is_file():
        description = json.loads(marker.read_text())
        notice = description.get("warning") or DEMO_NOTICE
        return CheckpointDescription(model_dir, description["model_id"], True, notice, checkpoint_profile(model_dir))
    profile = checkpoint_profile(model_dir, checkpoint)
    model_id = profile.repo_id or config.get("_name_or_path") or model_dir.name
    return CheckpointDescription(model_dir, str(model_id), False, None, profile)
