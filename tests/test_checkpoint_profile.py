"""Which MedGemma 4B checkpoint a local folder holds, from its files alone, and what it can do: the folders a
Hugging Face download leaves (the cache's models--google--<name>/snapshots/<commit>, a --local-dir named after the
repository), the model card's title and base_model, config.json's _name_or_path, the operator's MODEL_CHECKPOINT,
and the demo's own marker. Anything else is unknown and can do neither."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgemma_xray.engine_bundle.checkpoint_profile import CheckpointProfile, checkpoint_profile
from medgemma_xray.serving.control_cli import checkpoint_line

BOTH = {"localisation", "longitudinal"}
GEMMA3_CONFIG = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]}


def snapshot(folder: Path, readme: str | None = None, config: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**GEMMA3_CONFIG, **(config or {})}))
    if readme is not None:
        (folder / "README.md").write_text(readme)
    return folder


@pytest.mark.parametrize(
    ("where", "readme", "config", "repo_id"),
    [
        ("hub/models--google--medgemma-1.5-4b-it/snapshots/0123abcd", None, None, "google/medgemma-1.5-4b-it"),
        ("hub/models--google--medgemma-4b-it/snapshots/0123abcd", None, None, "google/medgemma-4b-it"),
        ("downloads/medgemma-1.5-4b-it", None, None, "google/medgemma-1.5-4b-it"),
        ("downloads/medgemma-4b-it", None, None, "google/medgemma-4b-it"),
        (
            "a/b",
            "---\nlicense: other\nlibrary_name: transformers\n---\n# MedGemma 1.5 model card\n",
            None,
            "google/medgemma-1.5-4b-it",
        ),
        (
            "a/c",
            "---\nlicense: other\nbase_model: google/gemma-3-4b-pt\n---\n\n# MedGemma model card\n",
            None,
            "google/medgemma-4b-it",
        ),
        (
            "a/d",
            "---\nbase_model:\n- google/medgemma-1.5-4b-it\ntags:\n- medical\n---\n# Quantised copy\n",
            None,
            "google/medgemma-1.5-4b-it",
        ),
        ("a/e", None, {"_name_or_path": "google/medgemma-1.5-4b-it"}, "google/medgemma-1.5-4b-it"),
    ],
    ids=[
        "hf-cache-1.5",
        "hf-cache-1",
        "local-dir-1.5",
        "local-dir-1",
        "card-title-1.5",
        "card-title-1",
        "card-base-model",
        "config-name",
    ],
)
def test_a_snapshot_is_recognised_from_its_local_files(tmp_path, where, readme, config, repo_id):
    profile = checkpoint_profile(snapshot(tmp_path / where, readme, config))
    assert profile.repo_id == repo_id
    assert profile.capabilities == (BOTH if "1.5" in repo_id else set())
    assert profile.kind == ("MedGemma 1.5 4B" if "1.5" in repo_id else "MedGemma 4B") and profile.source


def test_an_unknown_checkpoint_can_do_neither_and_the_operator_can_say_which_it_is(tmp_path):
    folder = snapshot(tmp_path / "site" / "model", "# Some fine-tune\n")
    unknown = checkpoint_profile(folder)
    assert unknown.repo_id == "" and unknown.capabilities == frozenset() and "unrecognised" in unknown.kind
    assert checkpoint_profile(folder, "medgemma-1.5-4b-it").capabilities == BOTH
    assert checkpoint_profile(folder, "medgemma-4b-it").repo_id == "google/medgemma-4b-it"
    renamed = snapshot(tmp_path / "medgemma-1.5-4b-it-finetuned", None)
    assert checkpoint_profile(renamed).capabilities == BOTH  # the folder's name says 1.5 ...
    assert checkpoint_profile(renamed, "other").capabilities == frozenset()  # ... and the operator says otherwise
    with pytest.raises(ValueError, match="MODEL_CHECKPOINT"):
        checkpoint_profile(folder, "medgemma-27b")
    assert "no localisation, no prior comparison" in checkpoint_line({"checkpoint_kind": unknown.kind})


def test_the_demo_declares_its_own_capabilities_and_unknown_names_are_dropped(tmp_path):
    folder = snapshot(tmp_path / "medgemma-1.5-4b-it")  # a folder name never outranks the demo's marker
    (folder / "demo_checkpoint.json").write_text(json.dumps({"model_id": "demo", "capabilities": ["longitudinal"]}))
    assert checkpoint_profile(folder, "medgemma-1.5-4b-it").capabilities == {"longitudinal"}
    (folder / "demo_checkpoint.json").write_text(
        json.dumps({"model_id": "demo", "capabilities": ["localisation", "longitudinal", "mind reading"]})
    )
    profile = checkpoint_profile(folder)
    assert profile.capabilities == BOTH and profile.kind == "demo checkpoint"
    assert CheckpointProfile.from_manifest(profile.as_manifest()) == profile  # what a bundle records reads back
    assert checkpoint_line({"checkpoint_kind": "demo checkpoint", "capabilities": sorted(BOTH)}) == (
        "demo checkpoint; can: localisation, longitudinal"
    )


def test_model_checkpoint_is_a_validated_setting_and_names_the_model(tmp_path):
    from medgemma_xray.pytorch_backend.checkpoint import describe_checkpoint
    from medgemma_xray.serving.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="MODEL_CHECKPOINT"):
        Settings.from_env({"MODEL_CHECKPOINT": "medgemma-2"})
    assert Settings.from_env({"MODEL_CHECKPOINT": "medgemma-4b-it"}).model_checkpoint == "medgemma-4b-it"
    folder = snapshot(tmp_path / "hub" / "models--google--medgemma-1.5-4b-it" / "snapshots" / "abc")
    described = describe_checkpoint(folder)
    assert described.model_id == "google/medgemma-1.5-4b-it" and described.profile.capabilities == BOTH
