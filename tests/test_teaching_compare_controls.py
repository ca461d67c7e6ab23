"""What changed? on a case with a prior, by the serving checkpoint's capabilities (web.teaching_compare): asked
only where the checkpoint declares "longitudinal"; elsewhere the button is disabled and its note says that
MedGemma 1.5 compares, never a faked answer. The surface here answers info() only: the one thing the controls
read (the browser tests run the enabled path against a real server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from medgemma_xray.inference_api.types import BackendInfo, Mode
from medgemma_xray.web.teaching_compare import LOADING, prior_controls


class InfoOnly:
    def __init__(self, info: BackendInfo | None) -> None:
        self._info = info

    def info(self) -> BackendInfo | None:
        return self._info


def _info(capabilities: frozenset[str], kind: str) -> BackendInfo:
    return BackendInfo(Mode.PYTORCH, "bf16", "cpu", "transformers", "model", False, capabilities=capabilities,
                       checkpoint_kind=kind)  # fmt: skip


PAIRED = SimpleNamespace(prior=SimpleNamespace(change_key={"pleural_effusion": "grew"}))


@pytest.mark.parametrize(
    ("info", "enabled", "note"),
    [
        (_info(frozenset({"localisation", "longitudinal"}), "MedGemma 1.5 4B"), True, ""),
        (_info(frozenset({"localisation"}), "MedGemma 4B"), False, "does not compare a film with a prior"),
        (None, False, LOADING),
    ],
)
def test_what_changed_follows_the_checkpoints_longitudinal_capability(info, enabled, note):
    controls = prior_controls(SimpleNamespace(service=InfoOnly(info)), PAIRED)
    assert controls["compare_button"]["interactive"] is enabled and controls["compare_button"]["visible"] is True
    assert controls["change_group"]["visible"] is True
    assert note in controls["compare_note"]
    if not enabled and info is not None:  # which checkpoint, and which one compares
        assert "(MedGemma 4B) does not compare a film with a prior film; MedGemma 1.5 4B" in controls["compare_note"]


def test_a_case_without_a_prior_shows_no_prior_controls():
    controls = prior_controls(SimpleNamespace(service=InfoOnly(None)), SimpleNamespace(prior=None))
    assert controls["compare_button"]["visible"] is False and controls["change_group"]["visible"] is False
    assert controls["compare_note"] == ""
