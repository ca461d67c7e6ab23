"""The model's answer to "Where is <finding>?" as something the page can draw: its boxes on the film, or a notice.

A model that does not locate a finding is not an error: no box list, an empty list, or boxes refused as invalid
(outside the film, corners out of order) each become a notice in words, shown beside the film.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medgemma_xray.teaching.marks import ModelLocation, shown_name

if TYPE_CHECKING:
    from medgemma_xray.inference_api.types import BackendInfo

DID_NOT_LOCATE = "The model did not locate the {finding}"


def location_from_answer(finding: str, text: str, shape: tuple[int, int], stopped: bool = False) -> ModelLocation:
    """The boxes in a localisation answer (MedGemma 1.5's format, grounding.boxes) on a film of shape (rows,
    columns), with a notice for what was not drawn."""
    from medgemma_xray.grounding.boxes import BoxFormatError, parse_boxes
    from medgemma_xray.grounding.prompts import strip_thinking

    rows, cols = shape
    name = shown_name(finding)
    if stopped:
        return ModelLocation(finding, (), f"Stopped before the model located the {name}.")
    try:
        parsed = parse_boxes(strip_thinking(text), rows, cols)
    except BoxFormatError as error:
        return ModelLocation(finding, (), f"{DID_NOT_LOCATE.format(finding=name)}: {error}.")
    notices = []
    if not parsed.boxes:
        notices.append(f"{DID_NOT_LOCATE.format(finding=name)} (it answered with no box).")
    if parsed.refused:
        notices.append("Left out, as not a valid box on this film: " + "; ".join(parsed.refused) + ".")
    return ModelLocation(finding, parsed.boxes, " ".join(notices))


def localises(info: BackendInfo | None) -> bool:
    """Whether the serving checkpoint declares that it localises findings (BackendInfo.capabilities, from the
    checkpoint's profile)."""
    from medgemma_xray.engine_bundle.checkpoint_profile import LOCALISATION
    from medgemma_xray.inference_api.capabilities import has_capability

    return has_capability(info, LOCALISATION)


def not_localising(info: BackendInfo | None) -> str:
    """Why Where? is off, naming the checkpoint and the one that localises (inference_api.capabilities)."""
    from medgemma_xray.engine_bundle.checkpoint_profile import LOCALISATION
    from medgemma_xray.inference_api.capabilities import missing_capability_message

    return missing_capability_message(info, LOCALISATION)
