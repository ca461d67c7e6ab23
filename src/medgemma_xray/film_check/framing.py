"""Finding the film in what a resident uploads: a border, a viewer's frame, a burned-in marker, an inverted film.

The check (film_check.check) compares an image with frontal chest films. A film inside a white border or a
screenshot's toolbar and side panel is still a film, and so is an inverted one; a burned-in marker ("L PORTABLE
AP") is read by the model as if it were anatomy. So, in order, when the check refuses the image as uploaded:
1. the film is cut out of its frame (edge rows and columns that are flat chrome: most pixels within a few grey
   levels of the line's median, brighter than a film's black background) and checked again; accepted, it is
   read cropped, with a warning (only when the check refused the upload: a film's own flat rows, such as a
   uniform abdomen, would otherwise be cut too; a thin frame the check lets through stays);
2. a tight crop (the chest walls or the bases cut off) is checked as if the film went on, dark, beyond its
   edges: accepted, it is read as it is, with a warning;
3. the inverted image (and the inverted crop) is checked: accepted, the film is flagged as inverted, never read
   as it is.
Whatever is accepted (the upload as it is too), bright text in the film's top or bottom band (many thin strokes, not one line or bone) is
blanked in the model's copy, with a warning. Non-films stay refused: each stage must pass the same threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLAT_TOLERANCE = 4  # grey levels around a line's median that count as the same flat colour
FLAT_SHARE = 0.6  # a chrome line: at least this share of its pixels within FLAT_TOLERANCE of its median
CHROME_FLOOR = 12  # a line darker than this is the film's own black background, not a frame
MIN_KEPT = 0.35  # the film kept must be at least this share of each side, or nothing is cropped
MARKER_BAND = 0.14  # the top and bottom share of the film searched for burned-in text
STROKE_REACH = 4  # a stroke's pixel has a much darker pixel within this many columns
STROKE_CONTRAST = 80  # grey levels
STROKES_PER_ROW = 3  # a row of text crosses at least this many strokes
MARKER_ROWS = 6  # rows of text in one corner band that make a marker
MARKER_WIDTH = 0.08  # and the text spans at least this share of the film's width
TIGHT_MARGINS = (0.1, 0.2)  # a tight crop is checked again as if the film went on, dark, this share further


@dataclass(frozen=True)
class Framing:
    """Where the film is inside the upload: box (top, bottom, left, right) in its pixels."""

    box: tuple[int, int, int, int]
    shape: tuple[int, int]

    @property
    def cropped(self) -> bool:
        return self.box != (0, self.shape[0], 0, self.shape[1])

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        top, bottom, left, right = self.box
        return pixels[top:bottom, left:right]


def _gray(pixels: np.ndarray) -> np.ndarray:
    array = np.asarray(pixels)
    if array.ndim == 3:
        array = array[..., :3].mean(axis=2)
    return array.astype(np.int16)


def _chrome(line: np.ndarray) -> bool:
    median = float(np.median(line))
    return median >= CHROME_FLOOR and float((np.abs(line - median) <= FLAT_TOLERANCE).mean()) >= FLAT_SHARE


def find_film(pixels: np.ndarray) -> Framing:
    """The film's box inside flat borders and a viewer's chrome (the whole image when there is none)."""
    gray = _gray(pixels)
    rows, cols = gray.shape
    top, bottom, left, right = 0, rows, 0, cols
    changed = True
    while changed and bottom - top > 8 and right - left > 8:  # a toolbar's end can uncover a side panel
        changed = False
        while bottom - top > 8 and _chrome(gray[top, left:right]):
            top, changed = top + 1, True
        while bottom - top > 8 and _chrome(gray[bottom - 1, left:right]):
            bottom, changed = bottom - 1, True
        while right - left > 8 and _chrome(gray[top:bottom, left]):
            left, changed = left + 1, True
        while right - left > 8 and _chrome(gray[top:bottom, right - 1]):
            right, changed = right - 1, True
    if bottom - top < MIN_KEPT * rows or right - left < MIN_KEPT * cols:
        return Framing((0, rows, 0, cols), (rows, cols))
    return Framing((top, bottom, left, right), (rows, cols))


def _longest_chain(starts: np.ndarray, gap: int) -> int:
    """The most strokes in a row that follow each other within `gap` pixels: letters of a word sit close; a tube,
    a line and a pacemaker lead crossing one row lie far apart."""
    if starts.size == 0:
        return 0
    breaks = np.flatnonzero(np.diff(starts) > gap)
    edges = np.concatenate([[-1], breaks, [starts.size - 1]])
    return int(np.diff(edges).max())


def marker_box(pixels: np.ndarray) -> tuple[int, int, int, int] | None:
    """The box (top, bottom, left, right) of burned-in text in the film's top or bottom band, or None: rows that
    cross several short, near-white strokes standing out from beside them (letters), where a film's tube, line or
    bone crosses a row once or twice."""
    gray = _gray(pixels)
    rows, cols = gray.shape
    band = max(8, int(rows * MARKER_BAND))
    bright = gray >= max(235, int(np.percentile(gray, 99.5)))
    # A letter's stroke stands out from both sides of it; bright bone, the edge of a bright disc or noise does not.
    left_side, right_side = gray.copy(), gray.copy()
    for shift in range(1, STROKE_REACH + 1):
        left_side[:, shift:] = np.minimum(left_side[:, shift:], gray[:, :-shift])
        right_side[:, :-shift] = np.minimum(right_side[:, :-shift], gray[:, shift:])
    bright &= (gray - left_side >= STROKE_CONTRAST) & (gray - right_side >= STROKE_CONTRAST)
    for top in (0, rows - band):
        strip = bright[top : top + band]
        for left, right in ((0, cols // 2), (cols // 2, cols)):
            part = strip[:, left:right].astype(np.int8)
            starts = np.diff(part, axis=1) == 1
            ends = np.diff(part, axis=1) == -1
            text_rows = 0  # rows crossed by several short strokes: letters, not one tube or bone
            for row_starts, row_ends in zip(starts, ends, strict=True):
                s, e = np.flatnonzero(row_starts), np.flatnonzero(row_ends)
                if s.size and e.size:
                    e = e[e > s[0]]
                    lengths = e[: s.size] - s[: e.size]
                    short = s[: lengths.size][(lengths >= 1) & (lengths <= max(3, rows // 60))]
                    text_rows += _longest_chain(short, max(4, rows // 25)) >= STROKES_PER_ROW
            hit_rows, hit_cols = np.nonzero(part)
            wide = hit_cols.size > 0 and hit_cols.max() - hit_cols.min() >= MARKER_WIDTH * cols  # a word, not a tube
            if text_rows >= MARKER_ROWS and wide:
                return (
                    top + int(hit_rows.min()), top + int(hit_rows.max()) + 1,
                    left + int(hit_cols.min()), left + int(hit_cols.max()) + 1,
                )  # fmt: skip
    return None


def blank(pixels: np.ndarray, box: tuple[int, int, int, int], pad: int = 3) -> np.ndarray:
    """pixels with the box (a little wider) filled by the median of its surroundings."""
    top, bottom, left, right = box
    out = pixels.copy()
    rows, cols = out.shape[:2]
    top, left = max(0, top - pad), max(0, left - pad)
    bottom, right = min(rows, bottom + pad), min(cols, right + pad)
    ring = np.concatenate(
        [out[max(0, top - pad) : top, left:right].ravel(), out[bottom : bottom + pad, left:right].ravel()]
    )
    out[top:bottom, left:right] = np.median(ring) if ring.size else 0
    return out


CROPPED = (
    "The film was cut out of a border or a viewer's frame (a screenshot or a scan): the model reads the film alone. "
    "Upload the film itself where you can."
)
TIGHT = (
    "The film looks tightly cropped (the chest walls or the bases are cut off): findings at its edges may be "
    "missed. Upload the whole film where you can."
)
MARKER = (
    'Burned-in text (a marker such as "L PORTABLE AP") was blanked in the model\'s copy, which would otherwise read '
    "it as part of the chest. Check the answers against the film."
)
INVERTED = (
    "This film looks inverted (bones dark, lungs bright), so the model will not read it as it is: a film read "
    "inverted gives confident, wrong answers. Invert it (the viewer's Invert, or export it again as MONOCHROME2) "
    "and upload it again."
)


@dataclass(frozen=True)
class Framed:
    """The film as the model should read it, and what was done: cropped and/or a marker blanked (warnings), or
    found inverted (inverted: the film is refused or, under FILM_CHECK=warn, read with a warning)."""

    pixels: np.ndarray
    verdict: object  # film_check.check.FilmVerdict of what is read
    warnings: tuple[str, ...] = ()
    inverted: bool = False


def framed_film(pixels: np.ndarray, reference) -> Framed:
    """The staged check of an 8-bit film (see the module docstring); every stage passes the same threshold."""
    from medgemma_xray.film_check.check import check_film

    verdict = check_film(pixels, reference)
    warnings: list[str] = []
    candidates = [pixels]
    framing = find_film(pixels) if not verdict.plausible else None  # a film's own flat rows (the abdomen) stay
    if framing is not None and framing.cropped:
        film = np.ascontiguousarray(framing.apply(pixels))
        candidates.append(film)
        cropped_verdict = check_film(film, reference)
        if cropped_verdict.plausible:
            pixels, verdict = film, cropped_verdict
            warnings.append(CROPPED)
    if not verdict.plausible:
        for share in TIGHT_MARGINS:
            margin = max(1, int(share * max(candidates[-1].shape)))
            widened = np.pad(candidates[-1], margin, constant_values=1)  # dark; 0 would be ignored as padding
            widened_verdict = check_film(widened, reference)
            if widened_verdict.plausible:
                pixels, verdict = candidates[-1], widened_verdict
                warnings.append(TIGHT)
                break
    if not verdict.plausible:
        for candidate in candidates:
            if check_film(255 - candidate, reference).plausible:
                return Framed(pixels, verdict, (INVERTED,), inverted=True)
    if verdict.plausible:
        box = marker_box(pixels)
        if box is not None:
            pixels = blank(pixels, box)
            warnings.append(MARKER)
    return Framed(pixels, verdict, tuple(warnings))
