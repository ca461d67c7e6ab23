"""Which checkpoint a model folder holds, and what it can do beyond describing a film: read from local files only.

MedGemma 1.5 4B (google/medgemma-1.5-4b-it) localises findings (boxes in its box_2d format) and compares a chest
film with a prior; MedGemma 1 4B (google/medgemma-4b-it) does neither. Both are Gemma 3 models with the same
config.json shapes, tokenizer and processor, so the weights' shapes cannot tell them apart; what can:
- the demo checkpoint's own marker (demo_checkpoint.json) declares its capabilities ("capabilities": [...]), as
  its training wrote them once it learnt them;
- the operator's word (MODEL_CHECKPOINT), for a copy whose files say nothing;
- the Hugging Face cache folder a snapshot sits in (models--google--medgemma-1.5-4b-it/snapshots/<commit>), or a
  folder named after the repository (huggingface-cli download --local-dir medgemma-1.5-4b-it);
- the model card (README.md) a snapshot carries: its title ("# MedGemma 1.5 model card" against "# MedGemma
  model card"), else its front matter's base_model (a re-upload or fine-tune names the checkpoint it came from);
- config.json's _name_or_path, where a save_pretrained wrote it.
Anything else is an unknown checkpoint: no capabilities, and the status surfaces say which checkpoint it is not.
Never imports torch; the engine bundle records the profile of the checkpoint it was built from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCALISATION = "localisation"  # answers "Where?" with boxes (MedGemma 1.5's box_2d format)
LONGITUDINAL = "longitudinal"  # compares a prior film with the current one in one prompt
CAPABILITIES = frozenset({LOCALISATION, LONGITUDINAL})

MEDGEMMA_1_5 = "google/medgemma-1.5-4b-it"
MEDGEMMA_1 = "google/medgemma-4b-it"
KNOWN = {
    MEDGEMMA_1_5: ("MedGemma 1.5 4B", frozenset({LOCALISATION, LONGITUDINAL})),
    MEDGEMMA_1: ("MedGemma 4B", frozenset()),
}
# MODEL_CHECKPOINT's values: auto (recognise from the files) or a checkpoint named by its repository's last part.
# "other": none of them (no capabilities), for a fine-tune whose files name the checkpoint it was made from.
CHECKPOINT_CHOICES = ("auto", "medgemma-1.5-4b-it", "medgemma-4b-it", "other")
DEMO_MARKER = "demo_checkpoint.json"

_README_TITLE = re.compile(r"^#\s*MedGemma\s*(1\.5)?\s*model card\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class CheckpointProfile:
    """repo_id: the checkpoint recognised (a KNOWN key), "" when unknown. kind: it in words, for status lines.
    source: how it was recognised (what an operator reads when it is wrong)."""

    repo_id: str
    kind: str
    capabilities: frozenset[str]
    source: str

    def as_manifest(self) -> dict[str, Any]:
        """What an engine bundle's manifest records of it (model.profile)."""
        return {
            "repo_id": self.repo_id,
            "kind": self.kind,
            "capabilities": sorted(self.capabilities),
            "source": self.source,
        }

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> CheckpointProfile:
        capabilities = frozenset(str(c) for c in entry.get("capabilities", ())) & CAPABILITIES
        return cls(
            str(entry.get("repo_id", "")), str(entry.get("kind", "")), capabilities, str(entry.get("source", ""))
        )


UNKNOWN_KIND = "unrecognised checkpoint (neither MedGemma 4B nor MedGemma 1.5 4B by its files)"


def checkpoint_profile(model_dir: str | Path, override: str = "auto") -> CheckpointProfile:
    """The profile of the checkpoint in model_dir (local files only). override: MODEL_CHECKPOINT."""
    model_dir = Path(model_dir)
    marker = model_dir / DEMO_MARKER
    if marker.is_file():
        return _demo_profile(marker)
    if override not in CHECKPOINT_CHOICES:
        raise ValueError(f"MODEL_CHECKPOINT must be one of {', '.join(CHECKPOINT_CHOICES)}, got {override!r}")
    if override == "other":
        return CheckpointProfile("", "a checkpoint other than MedGemma 4B or 1.5 4B", frozenset(), "MODEL_CHECKPOINT")
    if override != "auto":
        return _known(f"google/{override}", "MODEL_CHECKPOINT")
    for recognise in (_from_folder, _from_readme, _from_config):
        found = recognise(model_dir)
        if found is not None:
            return found
    return CheckpointProfile("", UNKNOWN_KIND, frozenset(), "")


def _known(repo_id: str, source: str) -> CheckpointProfile:
    kind, capabilities = KNOWN[repo_id]
    return CheckpointProfile(repo_id, kind, capabilities, source)


def _demo_profile(marker: Path) -> CheckpointProfile:
    try:
        description = json.loads(marker.read_text())
    except (OSError, ValueError):
        description = {}
    declared = description.get("capabilities") or ()
    capabilities = frozenset(str(c) for c in declared if isinstance(c, str)) & CAPABILITIES
    return CheckpointProfile("", "demo checkpoint", capabilities, DEMO_MARKER)


def _repo_in(text: str) -> str | None:
    """The KNOWN repository a name or path names (1.5 checked first: "medgemma-4b-it" is not inside its name)."""
    lowered = text.lower()
    for repo_id in (MEDGEMMA_1_5, MEDGEMMA_1):
        name = repo_id.split("/")[1]
        if re.search(rf"(^|[^a-z0-9.]){re.escape(name)}($|[^a-z0-9])", lowered):
            return repo_id
    return None


def _from_folder(model_dir: Path) -> CheckpointProfile | None:
    """The Hugging Face cache's models--google--<name>/snapshots/<commit>, or a folder named after the repository."""
    resolved = model_dir.resolve()
    for part in (resolved.name, *(parent.name for parent in resolved.parents[:3])):
        if part.startswith("models--"):
            cached = part[len("models--") :].replace("--", "/")
            return _known(cached, "Hugging Face cache folder") if cached in KNOWN else None
    named = _repo_in(resolved.name)
    return _known(named, "folder name") if named else None


def _from_readme(model_dir: Path) -> CheckpointProfile | None:
    try:
        text = (model_dir / "README.md").read_text(errors="replace")[:200_000]
    except OSError:
        return None
    # The card's own title first: a card may name what its model was made from in base_model (MedGemma 1.5's
    # own card could name MedGemma 1), while a re-upload keeps Google's title.
    title = _README_TITLE.search(text)
    if title:
        return _known(MEDGEMMA_1_5 if title.group(1) else MEDGEMMA_1, "model card title")
    for value in _front_matter_values(text, "base_model"):
        repo_id = _repo_in(value)
        if repo_id:
            return _known(repo_id, "model card base_model (a copy or fine-tune of it)")
    return None


def _front_matter_values(text: str, key: str) -> list[str]:
    """The values of `key` in a model card's YAML front matter: `key: value` or a `- value` list under it."""
    if not text.startswith("---"):
        return []
    front = text[3:].split("\n---", 1)[0]
    values, listing = [], False
    for line in front.splitlines():
        stripped = line.strip()
        if listing and stripped.startswith("- "):
            values.append(stripped[2:].strip().strip("'\""))
            continue
        listing = False
        name, _, value = line.partition(":")
        if name.strip() == key:
            value = value.strip().strip("'\"")
            if value:
                values.append(value)
            else:
                listing = True
    return values


def _from_config(model_dir: Path) -> CheckpointProfile | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    repo_id = _repo_in(str(config.get("_name_or_path") or ""))
    return _known(repo_id, "config.json _name_or_path") if repo_id else None
