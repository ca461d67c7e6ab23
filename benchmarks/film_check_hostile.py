"""The film check against a client who tries to pass it: what the residual risk is, in numbers.

    python -m benchmarks.film_check_hostile --seeds 10 --steps 400 --output benchmarks/results/DATE-film-check-hostile.json

Two attacks, each on images the check refuses as they are:
- blends: a frontal phantom mixed with a CT-like slice or a lateral phantom (negatives.py) at 30, 50 and 70 %;
- a search: a natural-scene stand-in scaled by 0.6 plus an 8 x 8 field of offsets (bilinear between the cells),
  the offsets hill-climbed one random cell at a time on the check's own distance (the attacker sees the verdict's
  distance; with only pass/refuse the search is slower, not stopped). Reported: how many scenes pass, and after how
  many steps.
The check is the shipped one (film_check/reference.json), through the upload's own 8-bit, pad-to-square path.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from medgemma_xray.film_check import check_film, load_reference
from medgemma_xray.film_check.calibration import as_uploaded, frontal_films
from medgemma_xray.film_check.negatives import negative_film

BLEND_WEIGHTS = (0.3, 0.5, 0.7)
FIELD = 8
SCALE = 0.6


def _resized(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    picture = Image.fromarray(image.astype(np.float32), mode="F").resize(shape[::-1], Image.Resampling.BILINEAR)
    return np.asarray(picture, dtype=np.float64)


def blends(reference, seeds: int) -> list[dict]:
    rows = []
    films = frontal_films(seeds, 0, 0, variety=False)
    for kind in ("ct", "lateral"):
        for weight in BLEND_WEIGHTS:
            passed = 0
            for seed, film in enumerate(films):
                other = as_uploaded(negative_film(kind, seed))
                mixed = (1 - weight) * film + weight * _resized(other, film.shape)
                passed += check_film((np.clip(mixed, 0, 1) * 255).astype(np.uint8), reference).plausible
            rows.append({"attack": f"phantom blended with {kind}", "weight": weight, "images": seeds, "passed": passed})
    return rows


def _distance(reference, scene: np.ndarray, offsets: np.ndarray) -> float:
    image = np.clip(SCALE * scene + _resized(offsets, scene.shape), 0, 1)
    return check_film(as_uploaded(image), reference).distance


def search(reference, seeds: int, steps: int) -> dict:
    passed_after, start_scores, end_scores = [], [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        scene = negative_film("natural", seed)
        field = np.zeros((FIELD, FIELD))

        best = _distance(reference, scene, field)
        start_scores.append(best)
        for step in range(1, steps + 1):
            trial = field.copy()
            trial[rng.integers(FIELD), rng.integers(FIELD)] += rng.normal(0, 0.15)
            score = _distance(reference, scene, trial)
            if score < best:
                field, best = trial, score
            if best <= reference.threshold:
                passed_after.append(step)
                break
        end_scores.append(best)
    return {
        "attack": f"natural scene x {SCALE} + {FIELD}x{FIELD} offset field, hill-climbed",
        "images": seeds,
        "passed": len(passed_after),
        "steps_to_pass": sorted(passed_after),
        "step_budget": steps,
        "distance_median_before_and_after": [float(np.median(start_scores)), float(np.median(end_scores))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    reference = load_reference()
    started = time.perf_counter()
    unattacked = {
        kind: sum(check_film(as_uploaded(negative_film(kind, seed)), reference).plausible for seed in range(args.seeds))
        for kind in ("ct", "lateral", "natural")
    }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'})",
        "command": "python -m benchmarks.film_check_hostile " + " ".join(sys.argv[1:] if argv is None else argv),
        "threshold": reference.threshold,
        "unattacked_passed": {kind: {"images": args.seeds, "passed": count} for kind, count in unattacked.items()},
        "blends": blends(reference, args.seeds),
        "search": search(reference, args.seeds, args.steps),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
