"""The alternative film check, measured for comparison: Mahalanobis distance of the demo model's mean-pooled
projected image features (what its vision tower hands the language model) from frontal phantoms'.

python -m benchmarks.film_check_vision_features [--fit 120] [--frontal 60] [--per-kind 10]
Prints a Markdown table like `python -m medgemma_xray.film_check --evaluate` and the seconds per image on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_path", default="models/medgemma-demo")
    parser.add_argument("--fit", type=int, default=120)
    parser.add_argument("--frontal", type=int, default=60)
    parser.add_argument("--per-kind", type=int, default=10)
    args = parser.parse_args(argv)

    from PIL import Image

    from medgemma_xray.film_check.calibration import (
        CHEST_FIT_SEED_START,
        FIT_SEED_START,
        as_uploaded,
        auroc,
        frontal_films,
    )
    from medgemma_xray.film_check.negatives import NEGATIVE_KINDS, negative_film
    from medgemma_xray.serving.factory import create_backend
    from medgemma_xray.serving.settings import Settings

    backend = create_backend("pytorch", Settings(model_path=args.model_path, device="cpu"))

    def pooled(films) -> np.ndarray:
        images = [Image.fromarray(np.repeat(film[:, :, None], 3, axis=2)) for film in films]
        rows = [np.asarray(backend.image_features([image]))[0].mean(axis=0) for image in images]
        return np.array(rows, dtype=np.float64)

    fit = pooled(
        frontal_films(args.fit // 2, FIT_SEED_START, CHEST_FIT_SEED_START, variety=False)
        + frontal_films(args.fit - args.fit // 2, FIT_SEED_START + args.fit, CHEST_FIT_SEED_START + args.fit, True)
    )
    mean = fit.mean(axis=0)
    covariance = np.cov(fit.T)
    covariance += np.eye(len(mean)) * 1e-2 * np.trace(covariance) / len(mean)
    precision = np.linalg.inv(covariance)

    def distances(features: np.ndarray) -> list[float]:
        offsets = features - mean
        return [float(np.sqrt(max(row @ precision @ row, 0.0))) for row in offsets]

    threshold = 1.5 * float(np.percentile(distances(fit), 99.5))
    started = time.perf_counter()
    frontal = distances(pooled(frontal_films(args.frontal, 0, 0, variety=False)))
    frontal += distances(pooled(frontal_films(args.frontal, args.frontal, args.frontal, variety=True)))
    negatives = {
        kind: distances(pooled([as_uploaded(negative_film(kind, seed)) for seed in range(args.per_kind)]))
        for kind in NEGATIVE_KINDS
    }
    count = len(frontal) + sum(len(v) for v in negatives.values())
    per_image = (time.perf_counter() - started) / count
    lines = ["| set | images | refused | AUROC vs frontal |", "|---|---|---|---|"]
    lines.append(
        f"| frontal phantoms, held out (plain + varied) | {len(frontal)} | "
        f"{np.mean(np.asarray(frontal) > threshold):.1%} | – |"
    )
    for kind, values in negatives.items():
        lines.append(
            f"| {kind} | {len(values)} | {np.mean(np.asarray(values) > threshold):.1%} | {auroc(frontal, values):.4f} |"
        )
    every = [v for values in negatives.values() for v in values]
    lines.append(
        f"| all negatives | {len(every)} | {np.mean(np.asarray(every) > threshold):.1%} | {auroc(frontal, every):.4f} |"
    )
    lines.append("")
    lines.append(f"Feature width {fit.shape[1]}; {per_image * 1000:.0f} ms per image (vision tower on this CPU).")
    sys.stdout.write("\n".join(lines) + "\n")
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
