"""What a round keeps of its prior film: the viewer's overview (never the full film: that stays once in the
intake's shared cache, as the current film's does), the model's 896-px input, the interval, the keys, and the
model's answer to "what changed?" once asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.viewer import DisplayFilm


@dataclass(frozen=True)
class PriorView:
    display: DisplayFilm  # the prior's overview, at most viewer.OVERVIEW_MAX_PX on its longer side
    model_image: object  # the PIL image the model reads as the prior
    image_key: str | None
    interval: str  # "3 months earlier"; "" for an uploaded prior (its date unknown)
    key: PhantomLabels | None = None
    change_key: dict[str, str] | None = None  # finding -> kind (teaching/change_scoring.py); None: not scored
    statement: str = ""  # the model's last answer to "what changed?"
    warnings: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        """What the prior costs a session: its overview and the model's input (RGB, one byte a channel)."""
        size = getattr(self.model_image, "size", (0, 0))
        return self.display.nbytes + 3 * int(size[0]) * int(size[1])
