"""One film's decode, as the intake runs it: the loader (xray_io, with its size and bomb checks), the film check
with the film found inside a frame, a crop or an inversion (film_check.framing), and the model's image with a small
preview. The same function runs in a decode worker process (intake.decode_pool) or, with the deadline off, in the
calling thread. What it returns is small, except the full-resolution values that a
viewer asks for: the full film never leaves this function."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from PIL import Image

    from medgemma_xray.film_check import FilmVerdict
    from medgemma_xray.film_check.check import Reference
    from medgemma_xray.xray_io import Radiograph
    from medgemma_xray.xray_io.values import FilmValues


@dataclass(frozen=True)
class DecodeTask:
    """What a decode needs: the bytes and the limits. reference: the film check's reference file, or None for no
    check."""

    data: bytes
    max_pixels: int
    max_bytes: int
    keep_values: bool
    reference: Path | None


@dataclass(frozen=True)
class DecodedFilm:
    model_image: Image.Image
    preview: Radiograph
    full_shape: tuple[int, int]
    verdict: FilmVerdict | None
    values: FilmValues | None
    inverted: bool = False  # the check accepted the inverted image: flagged, never read as it is
    framing_warnings: tuple[str, ...] = ()  # a frame cut away, a tight crop, a marker blanked, an inversion


def decode_film(task: DecodeTask) -> DecodedFilm:
    """Raises the loader's ImageInputError subclasses, each with its message for the user."""
    from medgemma_xray.film_check.framing import framed_film
    from medgemma_xray.xray_io.loader import load_radiograph, load_radiograph_with_values
    from medgemma_xray.xray_io.preprocess import case_images

    values = None
    if task.keep_values:
        radiograph, values = load_radiograph_with_values(
            task.data, max_pixels=task.max_pixels, max_bytes=task.max_bytes
        )
    else:
        radiograph = load_radiograph(task.data, max_pixels=task.max_pixels, max_bytes=task.max_bytes)
    verdict: FilmVerdict | None = None
    inverted = False
    framing_warnings: tuple[str, ...] = ()
    if task.reference is not None:
        found = framed_film(radiograph.pixels, reference_at(task.reference))  # borders, markers, inversion
        verdict = cast("FilmVerdict", found.verdict)
        inverted, framing_warnings = found.inverted, tuple(found.warnings)
        if found.pixels is not radiograph.pixels:
            radiograph = replace(radiograph, pixels=found.pixels)
    images = case_images(radiograph)
    del radiograph
    return DecodedFilm(
        images.model_image, images.preview, images.full_shape, verdict, values, inverted, framing_warnings
    )


@functools.lru_cache(maxsize=4)
def reference_at(path: Path) -> Reference:
    """The film check's reference, read once per process and path."""
    from medgemma_xray.film_check import load_reference

    return load_reference(path)
