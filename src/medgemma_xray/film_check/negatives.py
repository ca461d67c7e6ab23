"""Images that are not frontal chest films, made on the spot: the film check's negative set.

Each maker takes a numpy Generator and returns a float film in [0, 1] (2-D, bright = white), the same form as
medgemma_xray.phantoms.films.chest_phantom, so both go through the same 8-bit, pad-to-square path as an upload. Kinds:
noise, gradients, text (document scans), natural-image stand-ins (a photograph turned grey: sky, ground, objects,
1/f texture), lateral chest phantoms and CT-like axial slices saved as a picture.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _grid(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float64)
    return y / rows, x / cols


def _size(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(320, 640)), int(rng.integers(320, 640))


def _blur(image: np.ndarray, passes: int = 2) -> np.ndarray:
    for _ in range(passes):
        image = (
            image + np.roll(image, 1, 0) + np.roll(image, -1, 0) + np.roll(image, 1, 1) + np.roll(image, -1, 1)
        ) / 5
    return image


def noise(rng: np.random.Generator) -> np.ndarray:
    rows, cols = _size(rng)
    kind = rng.integers(3)
    if kind == 0:
        return rng.uniform(0, 1, (rows, cols))
    if kind == 1:
        return np.clip(rng.normal(rng.uniform(0.3, 0.7), rng.uniform(0.05, 0.3), (rows, cols)), 0, 1)
    return (rng.uniform(0, 1, (rows, cols)) < rng.uniform(0.05, 0.5)).astype(np.float64)  # salt and pepper


def gradient(rng: np.random.Generator) -> np.ndarray:
    rows, cols = _size(rng)
    y, x = _grid(rows, cols)
    if rng.integers(2):
        angle = rng.uniform(0, 2 * np.pi)
        ramp = np.cos(angle) * x + np.sin(angle) * y
    else:
        cy, cx = rng.uniform(0.2, 0.8, 2)
        ramp = np.hypot(y - cy, x - cx)
    ramp = (ramp - ramp.min()) / (np.ptp(ramp) or 1.0)
    return ramp if rng.integers(2) else 1 - ramp


def text_page(rng: np.random.Generator) -> np.ndarray:
    """A document scan: lines of text, dark on light (or light on dark), with margins."""
    from PIL import Image, ImageDraw, ImageFont

    rows, cols = _size(rng)
    paper, ink = (235, 20) if rng.integers(4) else (15, 230)
    page = Image.new("L", (cols, rows), paper)
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=int(rng.integers(11, 26)))
    words = ["patient", "report", "the", "chest", "film", "normal", "lorem", "ipsum", "dolor", "2026", "page", "of"]
    y = int(rng.integers(10, 40))
    while y < rows - 20:
        line = " ".join(rng.choice(words, size=int(rng.integers(3, 14))))
        draw.text((int(rng.integers(10, 40)), y), line, fill=ink, font=font)
        y += int(rng.integers(16, 36))
    return np.asarray(page, dtype=np.float64) / 255.0


def natural_scene(rng: np.random.Generator) -> np.ndarray:
    """A photograph's stand-in in grey: sky and ground, a horizon, blobs and boxes, 1/f texture."""
    rows, cols = _size(rng)
    y, x = _grid(rows, cols)
    spectrum = np.fft.fft2(rng.normal(size=(rows, cols)))
    fy, fx = np.meshgrid(np.fft.fftfreq(rows), np.fft.fftfreq(cols), indexing="ij")
    texture = np.real(np.fft.ifft2(spectrum / np.maximum(np.hypot(fy, fx), 1.0 / max(rows, cols)) ** 1.0))
    texture = (texture - texture.mean()) / (texture.std() or 1.0)
    horizon = rng.uniform(0.3, 0.7) + 0.05 * np.sin(x * rng.uniform(2, 12))
    image = np.where(y < horizon, rng.uniform(0.6, 0.95) - 0.2 * y, rng.uniform(0.2, 0.5) + 0.1 * y)
    for _ in range(int(rng.integers(2, 8))):
        cy, cx, ry, rx = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.03, 0.2), rng.uniform(0.03, 0.2)
        shape = (
            ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1
            if rng.integers(2)
            else ((np.abs(y - cy) < ry) & (np.abs(x - cx) < rx))
        )
        image = np.where(shape, rng.uniform(0, 1), image)
    return np.clip(image + rng.uniform(0.03, 0.12) * texture, 0, 1)


def lateral_chest(rng: np.random.Generator) -> np.ndarray:
    """A lateral chest phantom: one broad lung field, the spine along the back, heart in front low, sternum, arms up."""
    rows = int(rng.integers(440, 560))
    cols = int(rows * rng.uniform(0.8, 1.0))
    y, x = _grid(rows, cols)
    facing_left = bool(rng.integers(2))
    x = 1 - x if facing_left else x  # anterior is at small x
    film = np.full((rows, cols), 0.04)
    body = ((y - 0.55) / 0.58) ** 2 + ((x - 0.52) / rng.uniform(0.36, 0.44)) ** 2 <= 1
    film[body] = 0.45
    lung = ((y - 0.45) / 0.32) ** 2 + ((x - 0.52) / 0.3) ** 2 <= 1
    film[lung] = 0.18 + rng.uniform(-0.03, 0.03)
    film[(((y - 0.66) / 0.17) ** 2 + ((x - 0.35) / 0.17) ** 2 <= 1) & body] = 0.6  # heart, anterior
    spine_x = 0.8 + 0.03 * np.sin(y * 3)
    for level in np.arange(0.1, 0.95, 0.055):  # vertebral bodies along the back
        film[(np.abs(y - level) < 0.022) & (np.abs(x - spine_x) < 0.06)] = 0.8
    film[(np.abs(x - 0.16) < 0.012) & (y > 0.2) & (y < 0.6)] = 0.75  # sternum
    film[(y > 0.78 + 0.05 * np.cos(x * 4)) & body] = 0.5  # diaphragm and abdomen
    film[(y < 0.2) & (np.abs(x - 0.5) < 0.2) & body] = 0.7  # arms raised over the head
    film += 0.03 * _blur(rng.normal(size=film.shape), 3) * lung
    return np.clip(film + rng.normal(0, 0.01, film.shape), 0, 1)


def ct_slice(rng: np.random.Generator) -> np.ndarray:
    """An axial CT slice of the chest in a lung or soft-tissue window, as a screenshot: black air around an ellipse
    wider than tall, the table below, two lungs, mediastinum and a vertebra at the back (bottom)."""
    side = int(rng.integers(400, 600))
    y, x = _grid(side, side)
    film = np.zeros((side, side))
    ry, rx = rng.uniform(0.28, 0.36), rng.uniform(0.4, 0.47)

    def ellipse(cy, cx, a, b):
        return ((y - cy) / a) ** 2 + ((x - cx) / b) ** 2 <= 1

    film[ellipse(0.5, 0.5, ry, rx)] = 0.55
    film[ellipse(0.5, 0.5, ry - 0.03, rx - 0.03)] = 0.45  # fat ring inside the skin
    lung_window = bool(rng.integers(2))
    lung_value = 0.12 if lung_window else 0.0
    for side_x in (0.3, 0.7):
        film[ellipse(0.48, side_x, ry * 0.75, rx * 0.38)] = lung_value
    film[ellipse(0.45, 0.5, ry * 0.45, rx * 0.22)] = 0.6 if not lung_window else 0.9  # mediastinum and heart
    film[ellipse(0.5 + ry * 0.72, 0.5, 0.06, 0.05)] = 1.0  # vertebra
    film[(np.abs(y - (0.5 + ry + 0.06)) < 0.012) & (np.abs(x - 0.5) < 0.45)] = 0.6  # the table
    if lung_window:
        film += 0.05 * _blur(rng.normal(size=film.shape), 2) * (film < 0.2) * (film > 0.05)
    return np.clip(film + rng.normal(0, 0.015, film.shape), 0, 1)


NEGATIVE_KINDS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "noise": noise,
    "gradient": gradient,
    "text": text_page,
    "natural": natural_scene,
    "lateral": lateral_chest,
    "ct": ct_slice,
}


def negative_film(kind: str, seed: int) -> np.ndarray:
    """One negative of the given kind; deterministic for (kind, seed)."""
    if kind not in NEGATIVE_KINDS:
        raise ValueError(f"unknown negative kind {kind!r}; valid kinds: {', '.join(NEGATIVE_KINDS)}")
    return NEGATIVE_KINDS[kind](np.random.default_rng([seed, list(NEGATIVE_KINDS).index(kind), 0x0D]))
