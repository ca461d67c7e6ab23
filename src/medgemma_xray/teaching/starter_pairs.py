"""The starter library's follow-up cases: progression pairs of phantoms (phantoms.progression: the same patient
twice, an effusion grown, a line removed, a nodule appeared), each a case whose sidecar carries the prior film,
its key and the pair's change key (teaching/prior_case.py; teaching/library.py writes the sidecar).

Both films of a pair are written in one format (12-bit DICOM for odd seeds, 8-bit PNG for even ones), so their
values share one scale and one window shows both alike, as two films of one patient from one machine do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medgemma_xray.teaching.prior_case import CaseChange

PAIR_SEED = 950_000  # held out, as the starter set's seeds are
INTERVALS = ("2 weeks earlier", "6 weeks earlier", "3 months earlier", "1 year earlier")


@dataclass(frozen=True)
class WrittenPair:
    stem: str
    film: Path  # the current film
    prior_name: str  # the prior film's file name, beside it
    interval: str
    current_labels: Any  # PhantomLabels
    prior_labels: Any
    changes: tuple[CaseChange, ...]


def _film_bytes(film, seed: int, rows: int) -> tuple[str, bytes]:
    from medgemma_xray.phantoms.films import dicom_bytes, png_bytes, quantize
    from medgemma_xray.phantoms.labelled import FILM_HEIGHT_CM

    if seed % 2:
        return ".dcm", dicom_bytes(
            quantize(film, 12),
            bits_stored=12,
            window=(2048, 4096),
            patient_id=f"SYNTHETIC-{seed:06d}",
            pixel_spacing_mm=10 * FILM_HEIGHT_CM / rows,
        )
    return ".png", png_bytes(quantize(film, 8))


def write_pair_films(folder: Path, seed: int) -> WrittenPair:
    """The pair of this seed's films written into `folder`; what its sidecar needs."""
    from medgemma_xray.phantoms.progression import progression_pair

    pair = progression_pair(seed)
    current, prior = pair.current, pair.prior
    rows = current.film.shape[0]
    stem = f"phantom_pair_{seed:06d}"
    suffix, current_bytes = _film_bytes(current.film, seed, rows)
    _, prior_bytes = _film_bytes(prior.film, seed, rows)
    film = folder / f"{stem}{suffix}"
    film.write_bytes(current_bytes)
    prior_name = f"{stem}.prior{suffix}"
    (folder / prior_name).write_bytes(prior_bytes)
    return WrittenPair(
        stem=stem,
        film=film,
        prior_name=prior_name,
        interval=INTERVALS[seed % len(INTERVALS)],
        current_labels=current.labels,
        prior_labels=prior.labels,
        changes=tuple(CaseChange(c.finding, c.kind, c.text) for c in pair.changes),
    )
