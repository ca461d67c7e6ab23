"""Fit the frontal-film reference and measure the check: AUROC and false-refusal rate on a generated set.

Positives are phantoms (medgemma_xray.phantoms.labelled and medgemma_xray.phantoms.films), each through the upload's own path (8-bit, zero-pad
to square), plus copies varied as real films vary (rotation, zoom, shift, exposure). The reference is fitted on
training seeds; the evaluation uses held-out seeds only (medgemma_xray.phantoms.evaluation's held-out range for the labelled
phantoms) and negatives of every kind in medgemma_xray.film_check.negatives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from medgemma_xray.film_check.check import Reference, check_film
from medgemma_xray.film_check.features import film_features
from medgemma_xray.film_check.negatives import NEGATIVE_KINDS, negative_film

FIT_SEED_START = (
    1_000_000  # the labelled phantoms' training range (medgemma_xray.phantoms.evaluation.HELD_OUT_SEED_LIMIT and up)
)
CHEST_FIT_SEED_START = 10_000  # medgemma_xray.phantoms.films.chest_phantom seeds for fitting; evaluation uses 0..
THRESHOLD_MARGIN = 1.5  # threshold = margin x the 99.5th percentile of the fitting films' distances
SHRINKAGE = 1e-3  # ridge on the covariance, relative to its mean variance, so rare directions do not dominate


def as_uploaded(film: np.ndarray) -> np.ndarray:
    """A float film in [0, 1] as the server holds it: 8-bit, zero-padded to square."""
    from medgemma_xray.phantoms.films import quantize
    from medgemma_xray.xray_io.preprocess import pad_to_square

    return pad_to_square(quantize(film, 8))


def varied(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The film as another machine and radiographer might have taken it: rotated a few degrees, zoomed, shifted,
    a different exposure curve, sometimes with a black collimation border."""
    from PIL import Image

    rows, cols = film.shape
    picture = Image.fromarray((film * 65535).astype(np.uint16).astype(np.int32), mode="I")
    picture = picture.rotate(rng.uniform(-6, 6), resample=Image.Resampling.BILINEAR)
    zoom = rng.uniform(0.9, 1.12)
    width, height = int(cols * zoom), int(rows * zoom)
    picture = picture.resize((width, height), Image.Resampling.BILINEAR)
    left = (width - cols) // 2 + int(rng.integers(-cols // 20, cols // 20 + 1))
    top = (height - rows) // 2 + int(rng.integers(-rows // 20, rows // 20 + 1))
    picture = picture.crop((left, top, left + cols, top + rows))
    out = np.asarray(picture, dtype=np.float64) / 65535
    out = np.clip(out, 0, 1) ** rng.uniform(0.7, 1.4)
    if rng.uniform() < 0.3:
        border = int(rng.integers(4, max(5, min(rows, cols) // 12)))
        out[:border], out[-border:], out[:, :border], out[:, -border:] = 0, 0, 0, 0
    return out


def frontal_films(count: int, start_seed: int, chest_start_seed: int, variety: bool) -> list[np.ndarray]:
    """count phantoms as uploaded: three in four labelled phantoms, one in four plain chest phantoms."""
    from medgemma_xray.phantoms.films import chest_phantom
    from medgemma_xray.phantoms.labelled import labelled_phantom

    films = []
    for index in range(count):
        if index % 4 == 3:
            film = chest_phantom(seed=chest_start_seed + index // 4)
        else:
            film = labelled_phantom(start_seed + index - index // 4).film
        if variety:
            film = varied(film, np.random.default_rng([start_seed, index, 0xA6]))
        films.append(as_uploaded(film))
    return films


def fit_reference(films: list[np.ndarray], fitted_on: str) -> Reference:
    features = np.array([film_features(film) for film in films])
    mean = features.mean(axis=0)
    covariance = np.cov(features.T)
    covariance += np.eye(len(mean)) * SHRINKAGE * np.trace(covariance) / len(mean)
    provisional = Reference(mean, np.linalg.inv(covariance), float("inf"), fitted_on)
    distances = [provisional.distance(row) for row in features]
    threshold = THRESHOLD_MARGIN * float(np.percentile(distances, 99.5))
    return Reference(mean, provisional.precision, threshold, fitted_on)


def fit_on_phantoms(count: int = 800) -> Reference:
    """Half plain phantoms, half varied ones, all from training seeds."""
    plain = frontal_films(count // 2, FIT_SEED_START, CHEST_FIT_SEED_START, variety=False)
    more = frontal_films(count - count // 2, FIT_SEED_START + count, CHEST_FIT_SEED_START + count, variety=True)
    return fit_reference(
        plain + more,
        f"{count} phantoms (labelled seeds from {FIT_SEED_START}, chest phantoms from {CHEST_FIT_SEED_START}; half "
        "varied in rotation, zoom, shift and exposure)",
    )


def auroc(positive_scores, negative_scores) -> float:
    """Probability that a negative scores above a positive (ties count half): the Mann-Whitney statistic."""
    positive = np.asarray(positive_scores, dtype=np.float64)
    negative = np.asarray(negative_scores, dtype=np.float64)
    above = (negative[:, None] > positive[None, :]).sum() + 0.5 * (negative[:, None] == positive[None, :]).sum()
    return float(above / (len(positive) * len(negative)))


@dataclass(frozen=True)
class Evaluation:
    rows: list[dict]  # one per set: name, count, refused fraction, AUROC against the frontal films
    threshold: float
    seconds_per_image: float


def evaluate(reference: Reference, frontal: int = 200, per_kind: int = 50) -> Evaluation:
    """Held-out frontal phantoms (plain and varied) against per_kind negatives of each kind."""
    sets = {
        "frontal phantoms, held out": frontal_films(frontal, 0, 0, variety=False),
        "frontal phantoms, held out, varied": frontal_films(frontal, frontal, frontal, variety=True),
    }
    sets.update({kind: [as_uploaded(negative_film(kind, seed)) for seed in range(per_kind)] for kind in NEGATIVE_KINDS})
    started, checked = time.perf_counter(), 0
    scores = {}
    for name, films in sets.items():
        scores[name] = [check_film(film, reference).distance for film in films]
        checked += len(films)
    elapsed = (time.perf_counter() - started) / checked
    positives = scores["frontal phantoms, held out"] + scores["frontal phantoms, held out, varied"]
    negatives = [score for kind in NEGATIVE_KINDS for score in scores[kind]]
    rows = []
    for name, values in scores.items():
        is_frontal = name.startswith("frontal")
        row = {
            "set": name,
            "images": len(values),
            "refused": float(np.mean(np.asarray(values) > reference.threshold)),
            "median_score": float(np.median(values)),
            "min_score": float(np.min(values)),
            "max_score": float(np.max(values)),
            "auroc": None if is_frontal else auroc(positives, values),
        }
        rows.append(row)
    rows.append(
        {
            "set": "all negatives",
            "images": len(negatives),
            "refused": float(np.mean(np.asarray(negatives) > reference.threshold)),
            "median_score": float(np.median(negatives)),
            "min_score": float(np.min(negatives)),
            "max_score": float(np.max(negatives)),
            "auroc": auroc(positives, negatives),
        }
    )
    return Evaluation(rows, reference.threshold, elapsed)


def format_table(evaluation: Evaluation) -> str:
    lines = [
        "| set | images | refused | score: lowest / median / highest | AUROC vs frontal |",
        "|---|---|---|---|---|",
    ]
    for row in evaluation.rows:
        auc = "–" if row["auroc"] is None else f"{row['auroc']:.4f}"
        scores = f"{row['min_score']:.1f} / {row['median_score']:.1f} / {row['max_score']:.1f}"
        lines.append(f"| {row['set']} | {row['images']} | {row['refused']:.1%} | {scores} | {auc} |")
    lines.append("")
    lines.append(
        f"A score is the Mahalanobis distance of the image's statistics from frontal films'; threshold "
        f"{evaluation.threshold:.1f} (refused above). {evaluation.seconds_per_image * 1000:.0f} ms per image on this "
        "machine (features and distance)."
    )
    return "\n".join(lines)
