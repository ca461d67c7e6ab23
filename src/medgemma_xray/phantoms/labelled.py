"""Labelled synthetic chest films: the anatomy of medgemma_xray.phantoms.films plus findings, devices and technique drawn from
the labels (medgemma_xray.phantoms.findings), large and dense enough to be visible at the model's 896-px input after padding.

Coordinates are fractions of the film: y down the rows, x across the columns. The film is PA, so the patient's
right lung is on the viewer's left. FILM_HEIGHT_CM sets the scale for sizes given in centimetres.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels, sample_labels

FILM_HEIGHT_CM = 40.0
LUNG_CX = {"right": 0.30, "left": 0.70}
LUNG_RX = 0.15
THORACIC_WIDTH = (LUNG_CX["left"] + LUNG_RX) - (LUNG_CX["right"] - LUNG_RX)  # inner rib margins
LATERAL = {"right": -1.0, "left": 1.0}  # which way is lateral, in x, for each side


@dataclass(frozen=True)
class LabelledPhantom:
    film: np.ndarray  # float64 in [0, 1], 1 = bone white
    labels: PhantomLabels


@dataclass(frozen=True)
class DrawnMark:
    """The pixels one finding or device changed on the film (its side where it has one): where regions come from."""

    finding: str  # one of FINDINGS
    side: str | None
    mask: np.ndarray  # bool (rows, cols)


@dataclass(frozen=True)
class _Geometry:
    rows: int
    cols: int
    midline: float  # x of the spine and trachea (moves when the film is rotated)
    lung_cy: float
    lung_ry: float
    dome: dict  # side -> y of the costophrenic angle
    heart_width: float
    carina_y: float

    @property
    def cm(self) -> float:
        """One centimetre in y units."""
        return 1.0 / FILM_HEIGHT_CM


class _Canvas:
    """The film being drawn and its coordinate grids."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        grid_y, grid_x = np.mgrid[0:rows, 0:cols].astype(np.float64)
        self.y, self.x = grid_y / rows, grid_x / cols
        self.film = np.full((rows, cols), 0.04)

    def ellipse(self, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
        return ((self.y - cy) / ry) ** 2 + ((self.x - cx) / rx) ** 2 <= 1.0

    def distance_px(self, cy: float, cx: float) -> np.ndarray:
        return np.hypot((self.y - cy) * self.rows, (self.x - cx) * self.cols)

    def stroke(self, points: list[tuple[float, float]], width_px: float, value: float | None = None) -> np.ndarray:
        """Pixels within width_px / 2 of a polyline of (y, x) points; set to `value` if given (a radio-opaque tube)."""
        mask = np.zeros(self.film.shape, dtype=bool)
        pad = width_px / 2 + 1
        for (y0, x0), (y1, x1) in zip(points, points[1:], strict=False):
            r0, r1 = sorted((y0 * self.rows, y1 * self.rows))
            c0, c1 = sorted((x0 * self.cols, x1 * self.cols))
            rs = slice(max(int(r0 - pad), 0), min(int(r1 + pad) + 1, self.rows))
            cs = slice(max(int(c0 - pad), 0), min(int(c1 + pad) + 1, self.cols))
            ay, ax = (self.y[rs, cs] - y0) * self.rows, (self.x[rs, cs] - x0) * self.cols
            by, bx = (y1 - y0) * self.rows, (x1 - x0) * self.cols
            t = np.clip((ay * by + ax * bx) / max(by * by + bx * bx, 1e-9), 0.0, 1.0)
            mask[rs, cs] |= np.hypot(ay - t * by, ax - t * bx) <= width_px / 2
        if value is not None:
            self.film[mask] = value
        return mask


def _curve(*controls: tuple[float, float], samples: int = 16) -> list[tuple[float, float]]:
    """Points along a Bezier curve through the control points' hull (smooth catheters and leads)."""
    points = np.array(controls, dtype=np.float64)
    out = []
    for t in np.linspace(0.0, 1.0, samples):
        level = points.copy()
        while len(level) > 1:
            level = (1 - t) * level[:-1] + t * level[1:]
        out.append((float(level[0, 0]), float(level[0, 1])))
    return out


def _geometry(labels: PhantomLabels, rows: int, cols: int, rng: np.random.Generator) -> _Geometry:
    technique = labels.technique
    shift = rng.choice([-1.0, 1.0]) * rng.uniform(0.03, 0.05) if technique.rotated else rng.uniform(-0.006, 0.006)
    if technique.inspiration == "adequate":
        lung_cy, lung_ry = 0.45 + rng.uniform(-0.01, 0.01), 0.30
    else:
        lung_cy, lung_ry = 0.42 + rng.uniform(-0.01, 0.01), 0.235
    base = lung_cy + lung_ry - 0.005
    return _Geometry(
        rows=rows,
        cols=cols,
        midline=0.5 + float(shift),
        lung_cy=lung_cy,
        lung_ry=lung_ry,
        dome={"right": base - 0.015, "left": base},  # the liver lifts the right hemidiaphragm
        heart_width=labels.heart.cardiothoracic_ratio * THORACIC_WIDTH,
        carina_y=lung_cy - 0.09,
    )


def _lung_shape(canvas: _Canvas, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    """<= 1 inside a lung outline: a rounded apex above cy, the chest wall straight below it (the diaphragm cuts
    the base, so the costophrenic angle is sharp, as on a film)."""
    across = np.abs(canvas.x - cx) / rx
    return np.where(canvas.y <= cy, np.hypot((canvas.y - cy) / ry, across), across)


def _lung_masks(canvas: _Canvas, geo: _Geometry, diaphragm: np.ndarray) -> dict:
    return {
        side: (_lung_shape(canvas, geo.lung_cy, LUNG_CX[side], geo.lung_ry, LUNG_RX) <= 1.0) & (canvas.y < diaphragm)
        for side in LUNG_CX
    }


def _diaphragm_line(canvas: _Canvas, geo: _Geometry) -> np.ndarray:
    """y of the diaphragm at each column: a dome over each lung, lowest at the costophrenic angles."""
    line = np.empty_like(canvas.x)
    for side, cx in LUNG_CX.items():
        half = canvas.x < 0.5 if side == "right" else canvas.x >= 0.5
        bulge = 0.05 * np.clip(1.0 - ((canvas.x - cx) / LUNG_RX) ** 2, 0.0, 1.0)
        line[half] = (geo.dome[side] - bulge)[half]
    return line


def _texture(rng: np.random.Generator, rows: int, cols: int, block: int) -> np.ndarray:
    coarse = rng.normal(0.0, 1.0, size=(rows // block + 1, cols // block + 1))
    return np.kron(coarse, np.ones((block, block)))[:rows, :cols]


def _draw_anatomy(canvas: _Canvas, geo: _Geometry, labels: PhantomLabels, rng: np.random.Generator) -> dict:
    """Soft tissue, lungs with markings, heart, spine, airway, ribs, clavicles, diaphragm. Returns masks later
    steps need (lungs, pneumothorax space, diaphragm line)."""
    film, y, x = canvas.film, canvas.y, canvas.x
    body = canvas.ellipse(0.56, 0.5, 0.56, 0.47) | ((np.abs(x - 0.5) < 0.13) & (y < 0.2))  # thorax and neck
    film[body] = 0.42
    diaphragm = _diaphragm_line(canvas, geo)
    lungs = _lung_masks(canvas, geo, diaphragm)
    markings = _texture(rng, canvas.rows, canvas.cols, 6)
    collapsed_space = np.zeros_like(film, dtype=bool)
    pleural_line = np.zeros_like(film, dtype=bool)
    if labels.pneumothorax is not None:
        side = labels.pneumothorax.side
        scale = 0.78 if labels.pneumothorax.size == "small" else 0.58
        cx = LUNG_CX[side] - LATERAL[side] * (1 - scale) * LUNG_RX * 0.9
        cy = geo.lung_cy + (1 - scale) * geo.lung_ry * 0.7
        q = _lung_shape(canvas, cy, cx, geo.lung_ry * scale, LUNG_RX * scale)
        collapsed_space = lungs[side] & (q > 1.0)
        pleural_line = lungs[side] & (np.abs(q - 1.0) < 0.025)
    for mask in lungs.values():
        film[mask] = 0.16 + 0.035 * markings[mask]
    film[collapsed_space] = 0.06  # air with no lung markings beyond the visceral pleura
    film[pleural_line] = 0.36
    all_lungs = lungs["right"] | lungs["left"]
    for rib in range(10):  # posterior ribs as arcs across each lung
        arc = 0.2 + rib * 0.062 + 0.05 * np.cos((x - 0.5) * np.pi * 2.2)
        film[(np.abs(y - arc) < 0.009) & all_lungs] += 0.2

    heart_ry = 0.10 + 0.15 * geo.heart_width
    heart_cx = geo.midline + geo.heart_width / 6  # two thirds of the heart lie left of the midline
    heart_cy = geo.dome["left"] - 0.55 * heart_ry
    heart = canvas.ellipse(heart_cy, heart_cx, heart_ry, geo.heart_width / 2)
    film[heart] = 0.62
    film[(np.abs(x - geo.midline) < 0.045) & (y > 0.08)] = 0.78  # spine
    trachea = (np.abs(x - geo.midline) < 0.022) & (y < geo.carina_y)
    film[trachea] -= 0.22
    for side in LUNG_CX:  # main bronchi
        end = (geo.carina_y + 0.07, geo.midline + LATERAL[side] * 0.08)
        film[canvas.stroke([(geo.carina_y, geo.midline), end], 0.035 * canvas.rows)] -= 0.18
    clavicle = (np.abs(y - (0.17 + 0.06 * np.abs(x - 0.5))) < 0.012) & (np.abs(x - 0.5) < 0.3)
    film[clavicle] = 0.85  # clavicles stay symmetric about the true midline: rotation shows as offset heads
    below = (y > diaphragm) & body
    film[below] = 0.5
    return {
        "lungs": lungs,
        "collapsed_space": collapsed_space,
        "pleural_line": pleural_line,
        "diaphragm": diaphragm,
        "heart": heart & ~below,  # what shows of it above the diaphragm
    }


def _lobe_centre(geo: _Geometry, lobe: str, rng: np.random.Generator) -> tuple[float, float]:
    side = "right" if lobe.startswith("right") else "left"
    band = {"upper": (0.15, 0.40), "middle": (0.50, 0.64), "lower": (0.66, 0.80)}[lobe.split()[1]]
    fraction = rng.uniform(*band)
    top = geo.lung_cy - geo.lung_ry
    cy = top + fraction * 2 * geo.lung_ry
    cx = LUNG_CX[side] + LATERAL[side] * rng.uniform(-0.15, 0.45) * LUNG_RX
    return float(cy), float(cx)


def _draw_findings(canvas: _Canvas, geo: _Geometry, labels: PhantomLabels, masks: dict, rng) -> list[DrawnMark]:
    film, y, x = canvas.film, canvas.y, canvas.x
    px_per_cm = geo.cm * canvas.rows
    marks = []
    if labels.heart.enlarged:
        marks.append(DrawnMark("cardiomegaly", None, masks["heart"]))
    if labels.pneumothorax is not None:
        space = masks["collapsed_space"] | masks["pleural_line"]
        marks.append(DrawnMark("pneumothorax", labels.pneumothorax.side, space))
    if labels.consolidation is not None:
        # Patchy, ill-defined airspace opacity filling much of the lobe, with air bronchograms: unlike a mass it
        # is neither round nor homogeneous.
        cy, cx = _lobe_centre(geo, labels.consolidation.lobe, rng)
        side = "right" if labels.consolidation.lobe.startswith("right") else "left"
        extent = canvas.ellipse(cy, cx, rng.uniform(0.07, 0.09), rng.uniform(0.08, 0.1) * LUNG_RX / 0.15)
        region = extent & masks["lungs"][side] & ~masks["collapsed_space"]
        patchy = np.clip(0.6 + 0.5 * _texture(rng, canvas.rows, canvas.cols, 5), 0.0, 1.0)
        film[region] = np.maximum(film[region], 0.22 + 0.26 * patchy[region])
        for _ in range(3):  # air bronchograms: dark branching lines inside the opacity
            start = (cy + rng.uniform(-0.02, 0.02), cx - LATERAL[side] * 0.03)
            end = (cy + rng.uniform(-0.06, 0.06), cx + LATERAL[side] * rng.uniform(0.03, 0.07))
            film[canvas.stroke([start, end], 0.006 * canvas.rows) & region] -= 0.14
        marks.append(DrawnMark("consolidation", side, region))
    if labels.nodule is not None:
        cy, cx = _lobe_centre(geo, labels.nodule.lobe, rng)
        radius = labels.nodule.size_cm / 2 * px_per_cm
        lobes = [(cy, cx, radius)]
        if labels.nodule.kind == "mass":  # lobulated outline
            for angle in rng.uniform(0, 2 * math.pi, size=2):
                lobes.append(
                    (
                        cy + 0.5 * radius * math.sin(angle) / canvas.rows,
                        cx + 0.5 * radius * math.cos(angle) / canvas.cols,
                        0.7 * radius,
                    )
                )
        thickness = np.zeros_like(film)
        for ly, lx, lr in lobes:
            d = canvas.distance_px(ly, lx)
            thickness = np.maximum(thickness, np.sqrt(np.clip(1.0 - (d / lr) ** 2, 0.0, 1.0)))
        film += 0.32 * thickness
        side = "right" if labels.nodule.lobe.startswith("right") else "left"
        marks.append(DrawnMark("nodule_or_mass", side, thickness > 0))
    if labels.effusion is not None:
        # Fluid fills the costophrenic angle (small: the angle is blunted) and, larger, climbs the lateral chest
        # wall as a meniscus, concave upwards.
        rise = {"small": (0.0, 0.07), "moderate": (0.09, 0.10), "large": (0.2, 0.11)}[labels.effusion.size]
        for side in labels.effusion.sides:
            across = np.clip((LATERAL[side] * (x - LUNG_CX[side]) / LUNG_RX + 1.0) / 2.0, 0.0, 1.0)  # 0 medial
            level = geo.dome[side] - rise[0] - rise[1] * across**3
            pleural_space = _lung_shape(canvas, geo.lung_cy, LUNG_CX[side], geo.lung_ry * 1.03, LUNG_RX * 1.03) <= 1
            fluid = (y > level) & pleural_space & (y < masks["diaphragm"] + 0.005)
            film[fluid] = np.maximum(film[fluid], 0.56)
            marks.append(DrawnMark("pleural_effusion", side, fluid))
    return marks


def _draw_devices(canvas: _Canvas, geo: _Geometry, labels: PhantomLabels) -> list[DrawnMark]:
    width = 0.007 * canvas.rows
    svc_x = geo.midline - 0.06
    marks = []
    if labels.endotracheal_tube is not None:
        tip = geo.carina_y - labels.endotracheal_tube.tip_above_carina_cm * geo.cm
        tube = (np.abs(canvas.x - geo.midline) * canvas.cols < 0.011 * canvas.rows) & (canvas.y < tip)
        canvas.film[tube] = 0.93
        marks.append(DrawnMark("endotracheal_tube", None, tube))
    if labels.central_line is not None:
        tip_y = (
            geo.carina_y
            + {"superior vena cava": 0.0, "cavoatrial junction": 0.08, "right atrium": 0.15}[labels.central_line.tip]
        )
        if labels.central_line.route == "right internal jugular":
            path = _curve((0.0, 0.42), (0.18, 0.43), (0.26, svc_x)) + [(tip_y, svc_x - 0.005)]
        else:
            path = _curve((0.21, 0.86), (0.24, 0.62), (0.22, geo.midline), (0.3, svc_x)) + [(tip_y, svc_x - 0.005)]
        route_side = "right" if labels.central_line.route.startswith("right") else "left"
        marks.append(DrawnMark("central_line", route_side, canvas.stroke(path, width, 0.92)))
    if labels.pacemaker is not None:
        gx = 0.80 if labels.pacemaker.side == "left" else 0.20
        apex = (geo.dome["left"] - 0.07, geo.midline + geo.heart_width * 0.45)
        lead = _curve((0.2, gx), (0.22, geo.midline - 0.02), (0.34, svc_x), (apex[0] - 0.1, apex[1] - 0.1), apex)
        lead_mask = canvas.stroke(lead, width * 0.8, 0.95)
        generator = canvas.distance_px(0.2, gx) <= 0.035 * canvas.rows
        canvas.film[generator] = 0.98
        marks.append(DrawnMark("pacemaker", labels.pacemaker.side, lead_mask | generator))
    return marks


@dataclass(frozen=True)
class DrawnFilm:
    """A phantom before noise and exposure: the canvas, what each finding drew, and the random stream to go on with."""

    film: np.ndarray
    marks: tuple[DrawnMark, ...]
    lung_top: float  # y of the lung apices and of the costophrenic angles (the lower one): the lungs' height
    lung_base: float
    rng: np.random.Generator


def draw_film(seed: int, rows: int, cols: int | None, labels: PhantomLabels) -> DrawnFilm:
    """Anatomy, findings and devices of a phantom, noise-free, with the mask of every finding drawn. The single
    place the geometry is decided: labelled_phantom adds noise and exposure to it, phantoms.regions boxes its
    marks, so a region always covers what the film shows."""
    rng = np.random.default_rng([seed, 0xF11])
    seed_cols = int(rng.integers(416, 513)) // 16 * 16 * rows // 512  # drawn either way: same geometry for any cols
    cols = seed_cols if cols is None else cols
    canvas = _Canvas(rows, cols)
    geo = _geometry(labels, rows, cols, rng)
    masks = _draw_anatomy(canvas, geo, labels, rng)
    marks = _draw_findings(canvas, geo, labels, masks, rng)
    marks += _draw_devices(canvas, geo, labels)
    base = max(geo.dome.values())
    return DrawnFilm(canvas.film, tuple(marks), geo.lung_cy - geo.lung_ry, base, rng)


def labelled_phantom(seed: int, rows: int = 512, cols: int | None = None, labels: PhantomLabels | None = None):
    """A LabelledPhantom with the findings of sample_labels(seed), or of `labels` if given (same anatomy, noise and
    placement as that seed otherwise). Deterministic for a given seed, size and labels. cols defaults to a width
    drawn from the seed (416-512 at 512 rows), so zero-padding to square varies as with real films."""
    labels = sample_labels(seed) if labels is None else labels
    return expose(draw_film(seed, rows, cols, labels), labels)


def expose(drawn: DrawnFilm, labels: PhantomLabels) -> LabelledPhantom:
    """The drawn film with its exposure's noise and contrast: the finished phantom (consumes drawn.rng)."""
    rng = drawn.rng
    exposure = labels.technique.exposure
    noise = {"adequate": 0.01, "under": 0.022, "over": 0.012}[exposure]
    film = np.clip(drawn.film + rng.normal(0.0, noise, size=drawn.film.shape), 0.0, 1.0)
    gamma = {"adequate": (0.9, 1.1), "under": (0.5, 0.65), "over": (1.6, 1.9)}[exposure]
    return LabelledPhantom(film ** rng.uniform(*gamma), labels)


def write_labelled_set(folder: Path, count: int, *, start_seed: int = 0, rows: int = 512) -> list[Path]:
    """Films (even seeds PNG, odd seeds 12-bit DICOM), each with a sidecar `<name>.json` holding its labels."""
    from medgemma_xray.phantoms.films import dicom_bytes, png_bytes, quantize

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for seed in range(start_seed, start_seed + count):
        phantom = labelled_phantom(seed, rows)
        stem = f"synthetic_phantom_{seed:06d}"
        if seed % 2:
            path = folder / f"{stem}.dcm"
            data = dicom_bytes(
                quantize(phantom.film, 12),
                bits_stored=12,
                window=(2048, 4096),
                patient_id=f"SYNTHETIC-{seed:06d}",
                pixel_spacing_mm=10 * FILM_HEIGHT_CM / rows,
            )
            path.write_bytes(data)
        else:
            path = folder / f"{stem}.png"
            path.write_bytes(png_bytes(quantize(phantom.film, 8)))
        (folder / f"{stem}.json").write_text(phantom.labels.to_json())
        written.append(path)
    return written


def read_labels(film_path: Path) -> PhantomLabels:
    """The labels of a film written by write_labelled_set (its sidecar JSON)."""
    sidecar = Path(film_path).with_suffix(".json")
    if not sidecar.is_file():
        raise FileNotFoundError(f"{film_path}: no sidecar {sidecar.name}; films from write_labelled_set have one")
    return PhantomLabels.from_json(sidecar.read_text())


def main(argv: list[str] | None = None) -> int:
    """Write labelled phantoms for a demo or a test set: films plus sidecar label files, all marked SYNTHETIC."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--output", type=Path, required=True, help="folder to write into (created)")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--start_seed", type=int, default=0, help="seeds below 1,000,000 are never used in training")
    args = parser.parse_args(argv)
    for path in write_labelled_set(args.output, args.count, start_seed=args.start_seed):
        labels = read_labels(path)
        found = [name for name in FINDINGS if labels.present(name)]
        print(f"{path}: {', '.join(found) or 'no finding'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
