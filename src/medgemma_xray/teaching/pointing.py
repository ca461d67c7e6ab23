"""Where a case's key puts its findings on the film, and which overlays a round's view draws.

Key regions exist only for a phantom's own labels (phantoms.regions knows the phantom's geometry). A teacher's
key for a real film (teaching.keys: `synthetic` is the teacher's notice) says what is there, not where: such a
case has no key overlay and no overlap or zone score, and the page says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from medgemma_xray.phantoms.findings import SYNTHETIC_NOTICE, PhantomLabels
from medgemma_xray.teaching.marks import KEY_LAYER, MODEL_LAYER, STUDENT_LAYER, Pointing
from medgemma_xray.teaching.overlays import Layers

if TYPE_CHECKING:
    from medgemma_xray.teaching.mark_scoring import KeyRegion

NO_REGIONS = "This key says what the film shows, not where: no key region is drawn and overlap is not scored."


def key_regions(key: PhantomLabels | None, shape: tuple[int, int]) -> tuple[KeyRegion, ...] | None:
    """The key's regions on a film of shape (rows, columns), or None where the key has none (no key, or a
    teacher's key for a real film)."""
    if key is None or key.synthetic != SYNTHETIC_NOTICE:
        return None
    from medgemma_xray.phantoms.regions import finding_regions

    rows, cols = shape
    return tuple(finding_regions(key, rows, cols))


def layers_of(pointing: Pointing) -> Layers:
    """The overlays to draw now (those the student has not switched off): the student's marks, the model's boxes
    once it has located something, the key's regions once the case is revealed (Reveal sets them)."""
    shown = pointing.shown
    regions: Sequence[KeyRegion] = pointing.key_regions or ()
    key = tuple((r.finding, r.box) for r in regions) if KEY_LAYER in shown else ()
    return Layers(
        key=key,
        student=pointing.marks if STUDENT_LAYER in shown else (),
        model=pointing.model_boxes() if MODEL_LAYER in shown else (),
    )
