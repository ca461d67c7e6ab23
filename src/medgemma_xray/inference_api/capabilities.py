"""What a serving checkpoint can do beyond describing a film, and the words every door says when it cannot.

BackendInfo.capabilities comes from the checkpoint profile (engine_bundle/checkpoint_profile): "localisation"
(boxes for "Where?") and "longitudinal" (a prior film compared with the current one). A door never fakes a missing
one: it refuses the request, or the page hides the action, with these sentences.
"""

from __future__ import annotations

from medgemma_xray.inference_api.types import LOCALISATION, LONGITUDINAL, BackendInfo

_WHAT = {
    LOCALISATION: "does not localise findings (no boxes for 'Where?')",
    LONGITUDINAL: "does not compare a film with a prior film",
}


def has_capability(info: BackendInfo | None, capability: str) -> bool:
    return info is not None and capability in info.capabilities


def missing_capability_message(info: BackendInfo | None, capability: str) -> str:
    """Why the serving checkpoint cannot do `capability`, and what can: one sentence for a toast or a 400."""
    which = (info.checkpoint_kind or info.model_id) if info is not None else "the serving checkpoint"
    what = _WHAT.get(capability, f"does not have the {capability!r} capability")
    return (
        f"This checkpoint ({which}) {what}; MedGemma 1.5 4B (google/medgemma-1.5-4b-it) does. Serve it with "
        "MODEL_PATH (set MODEL_CHECKPOINT=medgemma-1.5-4b-it if its files do not say which checkpoint it is)."
    )
