"""The teaching viewer's pixels: the film's own values, window/level, zoom and pan, and the ruler and calliper.

Server-side rendering (the UI sends a view state, this returns the picture): one code path for DICOM, PNG and
JPEG, the same pixels in the browser test as on screen, no JavaScript build. The values come from the film
intake's one decode (medgemma_xray.intake, xray_io.values: display-ordered, higher is more attenuating); a session
keeps a small overview of them, and a zoomed view reads the full-resolution values from the intake's shared cache.
Each view costs one resample and one lookup (benchmarks/results/teaching_viewer.md).
Presets (lung, mediastinum, bone) are percentile windows of the film's own histogram, as OHIF derives a
radiograph's windows from its values (a plain film has no Hounsfield scale, and a fixed fraction of the file's
window renders one film black and another grey): "lung" spans the darkest to the upper-middle values, "mediastinum"
the bright half, "bone" the body to the brightest 0.1 %. "file" is the file's own window (its VOI LUT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from medgemma_xray.xray_io.values import FilmValues

VIEW_MAX_PX = 720  # the longer side of the rendered view
OVERVIEW_MAX_PX = 1080  # what a session keeps: 1.5 times the view, so a whole-film view is still sharp
MAX_ZOOM = 8.0
# (low, high) percentiles of the film's values that a preset's window spans
PRESET_PERCENTILES: dict[str, tuple[float, float]] = {
    "lung": (2.0, 75.0),
    "mediastinum": (45.0, 99.0),
    "bone": (20.0, 99.9),
}
PRESETS = tuple(PRESET_PERCENTILES)
TOOLS = ("ruler", "ctr", "pan", "probe", "mark")  # mark: the student points (web.teaching_marks)
CTR_POINTS = ("heart: right border", "heart: left border", "thorax: right inner margin", "thorax: left inner margin")


@dataclass(frozen=True)
class DisplayFilm:
    """What a session keeps of a film for the viewer: its display-ordered values at most OVERVIEW_MAX_PX on the
    longer side (a whole-film view resamples these), and what the viewer must know about the film. The film's
    full-resolution values are not here: they stay once in the intake's shared cache, under `key`, and a zoomed
    view reads them from there (render_view's `full`). A 6000 x 6000 film costs a session 4.7 MB, not 144.

    shape: the film's own (rows, columns): views, clicks and measurements are in its pixels.
    """

    overview: np.ndarray  # float32, the film resized to at most OVERVIEW_MAX_PX on its longer side
    shape: tuple[int, int]
    value_range: tuple[float, float]  # the lowest and highest value present
    default_window: tuple[float, float]  # (centre, width)
    pixel_spacing_mm: tuple[float, float] | None  # (between rows, between columns); None: uncalibrated
    bits: int
    source: str
    dicom_identity: dict[str, str] = field(default_factory=dict)  # the source's patient/study (the SR only)
    key: str = ""  # the film's content key in the intake (medgemma_xray.intake.FilmIntake.values)
    presets: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (centre, width)

    @property
    def scale(self) -> float:
        """Overview pixels per film pixel (1 when the film is no larger than the overview)."""
        return self.overview.shape[0] / self.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.overview.nbytes)

    @property
    def window_limits(self) -> tuple[float, float]:
        """The range the width slider may span: the values present, widened to include the default window."""
        centre, width = self.default_window
        low = min(self.value_range[0], centre - width / 2)
        high = max(self.value_range[1], centre + width / 2)
        return low, high

    def preset(self, name: str) -> tuple[float, float]:
        if name == "file":
            return self.default_window
        if name not in PRESET_PERCENTILES:
            raise ValueError(f"unknown preset {name!r}; choose from file, {', '.join(PRESETS)}")
        return self.presets.get(name) or percentile_windows(self.overview)[name]

    def value_at(self, row: float, col: float, full: np.ndarray | None = None) -> float:
        """The film's value at a film pixel: from the full-resolution values when given, else the overview's."""
        rows, cols = self.shape
        r, c = min(max(int(round(row)), 0), rows - 1), min(max(int(round(col)), 0), cols - 1)
        if full is not None and full.shape == self.shape:
            return float(full[r, c])
        o_rows, o_cols = self.overview.shape
        return float(self.overview[min(int(r * self.scale), o_rows - 1), min(int(c * o_cols / cols), o_cols - 1)])


def percentile_windows(values: np.ndarray) -> dict[str, tuple[float, float]]:
    """Each preset's (centre, width) from the values' percentiles (PRESET_PERCENTILES)."""
    wanted = sorted({q for pair in PRESET_PERCENTILES.values() for q in pair})
    found = dict(zip(wanted, np.percentile(values, wanted).tolist(), strict=True))
    windows = {}
    for name, (low_q, high_q) in PRESET_PERCENTILES.items():
        low, high = found[low_q], found[high_q]
        windows[name] = ((low + high) / 2, max(high - low, 1.0))
    return windows


def display_film(values: FilmValues, source: str, key: str = "", overview_max: int = OVERVIEW_MAX_PX) -> DisplayFilm:
    """The viewer's film from the values the intake kept (xray_io.values): a box-filtered overview and the facts."""
    from PIL import Image

    rows, cols = values.shape
    scale = min(1.0, overview_max / max(rows, cols))
    if scale < 1.0:
        size = (max(1, round(cols * scale)), max(1, round(rows * scale)))
        picture = Image.fromarray(values.values, mode="F").resize(size, Image.Resampling.BOX)
        overview = np.asarray(picture, dtype=np.float32)
    else:
        overview = values.values.copy()  # the session's own: the cache's array is shared and may be evicted
    return DisplayFilm(
        overview=overview,
        shape=(rows, cols),
        value_range=(float(values.values.min()), float(values.values.max())),
        default_window=values.default_window,
        pixel_spacing_mm=values.pixel_spacing_mm,
        bits=values.bits,
        source=source,
        dicom_identity=dict(values.identity),
        key=key,
        presets=percentile_windows(overview),
    )


# --- the view ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewState:
    centre: float
    width: float
    invert: bool = False
    zoom: float = 1.0
    focus: tuple[float, float] = (0.5, 0.5)  # the film point (y, x as fractions) at the centre of the view
    tool: str = "ruler"
    points: tuple[tuple[float, float], ...] = ()  # clicks in film pixels (row, col), for the current tool

    @classmethod
    def initial(cls, film: DisplayFilm) -> ViewState:
        centre, width = film.default_window
        return cls(centre=centre, width=width)

    def with_window(self, centre: float, width: float) -> ViewState:
        return replace(self, centre=float(centre), width=max(float(width), 1e-6))

    def zoomed(self, zoom: float) -> ViewState:
        return replace(self, zoom=float(min(max(zoom, 1.0), MAX_ZOOM)))

    def with_tool(self, tool: str) -> ViewState:
        if tool not in TOOLS:
            raise ValueError(f"unknown tool {tool!r}; choose from {', '.join(TOOLS)}")
        return replace(self, tool=tool, points=())


@dataclass(frozen=True)
class Crop:
    """The film rectangle a view shows (rows top..top+height, cols left..left+width) and the view's size."""

    top: float
    left: float
    height: float
    width: float
    out_rows: int
    out_cols: int

    def to_film(self, view_x: float, view_y: float) -> tuple[float, float]:
        """A click on the rendered view (pixel x, y) -> film (row, col)."""
        return (
            self.top + (view_y + 0.5) * self.height / self.out_rows - 0.5,
            self.left + (view_x + 0.5) * self.width / self.out_cols - 0.5,
        )

    def to_view(self, row: float, col: float) -> tuple[float, float]:
        return (
            (col + 0.5 - self.left) * self.out_cols / self.width - 0.5,
            (row + 0.5 - self.top) * self.out_rows / self.height - 0.5,
        )


def view_crop(shape: tuple[int, int], state: ViewState, view_max: int = VIEW_MAX_PX) -> Crop:
    rows, cols = shape
    scale = view_max / max(rows, cols)
    out_rows, out_cols = max(1, round(rows * scale)), max(1, round(cols * scale))
    height, width = rows / state.zoom, cols / state.zoom
    top = min(max(state.focus[0] * rows - height / 2, 0.0), rows - height)
    left = min(max(state.focus[1] * cols - width / 2, 0.0), cols - width)
    return Crop(top, left, height, width, out_rows, out_cols)


def windowed(values: np.ndarray, centre: float, width: float, invert: bool = False) -> np.ndarray:
    """Linear window/level to 8 bits: centre - width/2 is black, centre + width/2 white (inverted if asked)."""
    low = centre - width / 2
    scaled = (values - np.float32(low)) * np.float32(255.0 / max(width, 1e-6))
    out = np.clip(scaled, 0, 255).astype(np.uint8)
    return 255 - out if invert else out


def needs_full(film: DisplayFilm, state: ViewState, view_max: int = VIEW_MAX_PX) -> bool:
    """Whether this view is zoomed in past the overview's detail, so render_view wants the full-resolution values."""
    crop = view_crop(film.shape, state, view_max)
    return film.scale < 1.0 and crop.width / crop.out_cols < 1.0 / film.scale


def render_view(
    film: DisplayFilm, state: ViewState, view_max: int = VIEW_MAX_PX, full: np.ndarray | None = None
) -> tuple[np.ndarray, Crop]:
    """The view as a uint8 array, grayscale (rows, cols), or RGB (rows, cols, 3) when the current tool has marks to
    draw, and the crop it shows. full: the film's full-resolution values, used where the view is zoomed in past the
    overview's detail (without them such a view is resampled from the overview: correct, less sharp)."""
    from PIL import Image, ImageDraw

    crop = view_crop(film.shape, state, view_max)
    source = film.overview
    if full is not None and full.shape == film.shape and needs_full(film, state, view_max):
        source = full
    # Each axis at its own scale (the overview's sides are rounded apart), and never past the source's edge.
    row_scale, col_scale = source.shape[0] / film.shape[0], source.shape[1] / film.shape[1]
    box = (
        crop.left * col_scale,
        crop.top * row_scale,
        min((crop.left + crop.width) * col_scale, source.shape[1]),
        min((crop.top + crop.height) * row_scale, source.shape[0]),
    )
    resampled = Image.fromarray(source, mode="F").resize(
        (crop.out_cols, crop.out_rows), Image.Resampling.BILINEAR, box=box
    )
    grey = windowed(np.asarray(resampled), state.centre, state.width, state.invert)
    if not state.points:
        return grey, crop  # one channel: a third of the bytes to encode as PNG (most of a view's cost)
    picture = Image.fromarray(grey, mode="L").convert("RGB")
    if state.points:
        draw = ImageDraw.Draw(picture)
        marks = [crop.to_view(row, col) for row, col in state.points]
        colour = {"ruler": (255, 200, 0), "probe": (255, 64, 160)}.get(state.tool, (0, 200, 255))
        for x, y in marks:
            draw.ellipse((x - 4, y - 4, x + 4, y + 4), outline=colour, width=2)
        for first, second in zip(marks[0::2], marks[1::2], strict=False):
            draw.line((*first, *second), fill=colour, width=2)
    return np.asarray(picture), crop


def click(film: DisplayFilm, state: ViewState, view_x: float, view_y: float, view_max: int = VIEW_MAX_PX) -> ViewState:
    """A click on the view: pan centres there; the ruler keeps two points, the calliper four (then starts over)."""
    crop = view_crop(film.shape, state, view_max)
    row, col = crop.to_film(view_x, view_y)
    rows, cols = film.shape
    if state.tool == "pan":
        return replace(state, focus=(min(max(row / rows, 0.0), 1.0), min(max(col / cols, 0.0), 1.0)))
    if state.tool == "probe":
        return replace(state, points=((min(max(row, 0.0), rows - 1.0), min(max(col, 0.0), cols - 1.0)),))
    needed = 2 if state.tool == "ruler" else len(CTR_POINTS)
    points = state.points if len(state.points) < needed else ()
    return replace(state, points=(*points, (row, col)))


def thumbnail_png(film: DisplayFilm, longest: int = 256) -> bytes:
    """A small PNG of the whole film at its own window (the handout's picture of each case)."""
    import io

    from PIL import Image

    state = ViewState.initial(film)
    picture, _ = render_view(film, state, view_max=longest)
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    return buffer.getvalue()


def ruler_mm(film: DisplayFilm, first: tuple[float, float], second: tuple[float, float]) -> float | None:
    """The distance between two film points in millimetres; None when the film has no pixel spacing."""
    if film.pixel_spacing_mm is None:
        return None
    row_mm, col_mm = film.pixel_spacing_mm
    return math.hypot((second[0] - first[0]) * row_mm, (second[1] - first[1]) * col_mm)


def probe_text(film: DisplayFilm, state: ViewState, full: np.ndarray | None = None) -> str:
    """The probe's reading: the stored value (after the Modality LUT, for DICOM) and the grey it is shown as."""
    if not state.points:
        return "Probe: click a pixel to read its value."
    row, col = state.points[-1]
    value = film.value_at(row, col, full)
    shown = int(windowed(np.array([value], dtype=np.float32), state.centre, state.width, state.invert)[0])
    source = "" if full is not None else " (from the kept overview)"
    return (
        f"Probe at row {int(round(row))}, column {int(round(col))}: stored value {value:g}{source}, displayed grey "
        f"{shown} of 255 (window level {state.centre:g}, width {state.width:g})."
    )


def measurement_text(film: DisplayFilm, state: ViewState, full: np.ndarray | None = None) -> str:
    """What the current tool has measured, in words (Markdown). full: the film's full-resolution values, read by
    the probe (else it reads the overview)."""
    points = state.points
    if state.tool == "mark":
        return "Mark: pick the finding and point or box, then click the film (a box: two opposite corners)." + (
            " First corner placed: click the opposite corner." if points else ""
        )
    if state.tool == "pan":
        return "Pan: click where the view should centre."
    if state.tool == "probe":
        return probe_text(film, state, full)
    if state.tool == "ruler":
        if len(points) < 2:
            return f"Ruler: click two points ({len(points)} of 2)."
        pixels = math.dist(points[0], points[1])
        if film.pixel_spacing_mm is None:
            return f"Ruler: {pixels:.1f} px (uncalibrated: the film records no pixel spacing)."
        mm = ruler_mm(film, points[0], points[1])
        return f"Ruler: {mm:.1f} mm ({pixels:.1f} px at {film.pixel_spacing_mm[1]:.4g} mm/px)."
    if len(points) < len(CTR_POINTS):
        return f"CTR calliper: click the {CTR_POINTS[len(points)]} ({len(points) + 1} of {len(CTR_POINTS)})."
    heart = abs(points[1][1] - points[0][1])
    thorax = abs(points[3][1] - points[2][1])
    if thorax <= 0:
        return "CTR calliper: the thorax width is zero; click the two inner rib margins again."
    ratio = heart / thorax
    if film.pixel_spacing_mm is not None:
        col_mm = film.pixel_spacing_mm[1]
        widths = f"heart {heart * col_mm / 10:.1f} cm, thorax {thorax * col_mm / 10:.1f} cm"
    else:
        widths = f"heart {heart:.0f} px, thorax {thorax:.0f} px (uncalibrated)"
    return f"CTR calliper: cardiothoracic ratio {ratio:.2f} ({widths})."
