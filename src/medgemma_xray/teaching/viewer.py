"""The teaching viewer's pixels: the film's own values, window/level, zoom and pan, and the ruler and calliper.

Server-side rendering (the UI sends a view state, this returns the picture): one code path for DICOM, PNG and
JPEG, the same pixels in the browser test as on screen, no JavaScript build. It works on a copy of the film
decoded once per case and costs one resample and one lookup per view (benchmarks/results/teaching_viewer.md).

Values are "display-ordered": higher is more attenuating (white), as a radiologist reads a film.
- DICOM: the stored values through the Modality LUT (rescale), flipped for MONOCHROME1; the file's own window
  (first Window Center/Width) is the default; without one, the full range.
- PNG/JPEG: the 8 or 16 bits given; the default window spans the bit depth in use.
Presets (lung, mediastinum, bone) are fractions of the default window: a plain film has no Hounsfield scale, so
"lung" spreads the dark end, "bone" the bright end, on every film alike.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field, replace

import numpy as np

from medgemma_xray.xray_io import Radiograph, load_radiograph

VIEW_MAX_PX = 720  # the longer side of the rendered view
MAX_ZOOM = 8.0
# (centre, width) as fractions of the default window [low, high]
PRESETS: dict[str, tuple[float, float]] = {
    "lung": (0.30, 0.55),
    "mediastinum": (0.60, 0.45),
    "bone": (0.80, 0.35),
}
TOOLS = ("ruler", "ctr", "pan")
CTR_POINTS = ("heart: right border", "heart: left border", "thorax: right inner margin", "thorax: left inner margin")


@dataclass(frozen=True)
class DisplayFilm:
    """A film's display-ordered values (float32, rows x cols) and what the viewer needs to know about them."""

    values: np.ndarray
    default_window: tuple[float, float]  # (centre, width)
    pixel_spacing_mm: tuple[float, float] | None  # (between rows, between columns); None: uncalibrated
    bits: int
    source: str
    dicom_identity: dict = field(default_factory=dict)  # the source's patient/study attributes (for the SR only)
    overview: np.ndarray | None = None  # values box-averaged by overview_factor: wide views resample this
    overview_factor: int = 1

    def with_overview(self, view_max: int = VIEW_MAX_PX) -> DisplayFilm:
        """Precompute a box-averaged copy at 1.5 to 2 times the view size, so a whole-film view resamples a few
        hundred thousand values rather than the full film (4-5 Mpx for a real chest film)."""
        factor = round(max(self.shape) / (1.5 * view_max))
        if factor < 2:
            return self
        from PIL import Image

        reduced = np.asarray(Image.fromarray(self.values, mode="F").reduce(factor), dtype=np.float32)
        return replace(self, overview=reduced, overview_factor=factor)

    @property
    def shape(self) -> tuple[int, int]:
        rows, columns = self.values.shape
        return rows, columns

    @property
    def window_limits(self) -> tuple[float, float]:
        """The range the width slider may span: the values present, widened to include the default window."""
        centre, width = self.default_window
        low = min(float(self.values.min()), centre - width / 2)
        high = max(float(self.values.max()), centre + width / 2)
        return low, high

    def preset(self, name: str) -> tuple[float, float]:
        if name == "file":
            return self.default_window
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from file, {', '.join(PRESETS)}")
        centre, width = self.default_window
        low = centre - width / 2
        fraction_centre, fraction_width = PRESETS[name]
        return low + fraction_centre * width, fraction_width * width


IDENTITY_KEYWORDS = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "AccessionNumber",
    "StudyID",
    "StudyDate",
    "StudyTime",
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SOPInstanceUID",
    "SOPClassUID",
    "ReferringPhysicianName",
)


def read_display_film(data: bytes, *, max_pixels: int, max_bytes: int) -> tuple[Radiograph, DisplayFilm]:
    """The model's film (xray_io's checks and 8-bit film) and the viewer's raw-valued film of the same bytes.

    Raises xray_io's ImageInputError subclasses for a file the loader refuses."""
    film = load_radiograph(data, max_pixels=max_pixels, max_bytes=max_bytes)
    from medgemma_xray.xray_io.loader import is_dicom, is_dicom_without_preamble

    if is_dicom(data) or is_dicom_without_preamble(data):
        return film, _dicom_display(data, film).with_overview()
    return film, _raster_display(data, film).with_overview()


def _dicom_display(data: bytes, film: Radiograph) -> DisplayFilm:
    import pydicom
    from pydicom.pixels import apply_modality_lut, pixel_array

    dataset = pydicom.dcmread(io.BytesIO(data), force=True)
    stored = pixel_array(dataset)
    values = np.asarray(apply_modality_lut(stored, dataset), dtype=np.float32)
    low, high = float(values.min()), float(values.max())
    window = _first_window(dataset)
    if window is None or window[1] < 1:
        window = ((low + high) / 2, max(high - low, 1.0))
    if str(dataset.get("PhotometricInterpretation", "")).strip() == "MONOCHROME1":
        values = (low + high) - values  # bright = attenuating, as on the model's film
        window = ((low + high) - window[0], window[1])
    spacing = None
    raw_spacing = dataset.get("PixelSpacing") or dataset.get("ImagerPixelSpacing")
    try:
        if raw_spacing is not None and len(raw_spacing) == 2 and all(float(v) > 0 for v in raw_spacing):
            spacing = (float(raw_spacing[0]), float(raw_spacing[1]))
    except (TypeError, ValueError):
        spacing = None
    identity = {k: str(dataset.get(k)) for k in IDENTITY_KEYWORDS if str(dataset.get(k, "") or "").strip()}
    return DisplayFilm(values, window, spacing, int(dataset.get("BitsStored", 16)), film.source, identity)


def _first_window(dataset) -> tuple[float, float] | None:
    centre, width = dataset.get("WindowCenter"), dataset.get("WindowWidth")
    if centre is None or width is None:
        return None
    try:
        centre = centre[0] if isinstance(centre, (list, tuple)) or hasattr(centre, "__getitem__") else centre
        width = width[0] if isinstance(width, (list, tuple)) or hasattr(width, "__getitem__") else width
        centre, width = float(centre), float(width)
    except (TypeError, ValueError, IndexError):
        return None
    return (centre, width) if math.isfinite(centre) and math.isfinite(width) else None


def _raster_display(data: bytes, film: Radiograph) -> DisplayFilm:
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as image:
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            raw = np.asarray(ImageOps.exif_transpose(image), dtype=np.float32)
            if raw.shape == film.shape:
                bits = 16
                return DisplayFilm(raw, (2**bits / 2, float(2**bits)), None, bits, film.source)
    values = film.pixels.astype(np.float32)  # 8 bits as given (grayscale conversion and orientation applied)
    return DisplayFilm(values, (128.0, 256.0), None, 8, film.source)


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


def render_view(film: DisplayFilm, state: ViewState, view_max: int = VIEW_MAX_PX) -> tuple[np.ndarray, Crop]:
    """The view as a uint8 array, grayscale (rows, cols), or RGB (rows, cols, 3) when the current tool has marks to
    draw, and the crop it shows."""
    from PIL import Image, ImageDraw

    crop = view_crop(film.shape, state, view_max)
    source, factor = film.values, 1
    if film.overview is not None and crop.width / crop.out_cols >= film.overview_factor:
        source, factor = film.overview, film.overview_factor
    box = (crop.left / factor, crop.top / factor, (crop.left + crop.width) / factor, (crop.top + crop.height) / factor)
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
        colour = (255, 200, 0) if state.tool == "ruler" else (0, 200, 255)
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
    needed = 2 if state.tool == "ruler" else len(CTR_POINTS)
    points = state.points if len(state.points) < needed else ()
    return replace(state, points=(*points, (row, col)))


def ruler_mm(film: DisplayFilm, first: tuple[float, float], second: tuple[float, float]) -> float | None:
    """The distance between two film points in millimetres; None when the film has no pixel spacing."""
    if film.pixel_spacing_mm is None:
        return None
    row_mm, col_mm = film.pixel_spacing_mm
    return math.hypot((second[0] - first[0]) * row_mm, (second[1] - first[1]) * col_mm)


def measurement_text(film: DisplayFilm, state: ViewState) -> str:
    """What the current tool has measured, in words (Markdown)."""
    points = state.points
    if state.tool == "pan":
        return "Pan: click where the view should centre."
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
