"""python -m medgemma_xray.film_check --calibrate [--output PATH] [--frontal-dir DIR] | --evaluate [--json PATH]

--calibrate fits the reference on phantoms (or on a folder of the site's own frontal films, DICOM/PNG/JPEG, which
is what a deployment on real films should do) and writes it; --evaluate prints the Markdown table in the README.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from medgemma_xray.film_check.check import REFERENCE_PATH, load_reference

logger = logging.getLogger("film_check")


def _films_in(folder: Path) -> list:
    from medgemma_xray.xray_io import ImageInputError, load_radiograph
    from medgemma_xray.xray_io.preprocess import pad_to_square

    films = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            films.append(pad_to_square(load_radiograph(path.read_bytes()).pixels))
        except ImageInputError as exc:
            logger.warning("skipped one file: %s", type(exc).__name__)
    if len(films) < 50:
        raise SystemExit(f"{folder} holds {len(films)} readable films; fit the reference on at least 50")
    return films


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m medgemma_xray.film_check", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--calibrate", action="store_true", help="fit the reference and write it")
    action.add_argument("--evaluate", action="store_true", help="AUROC and refusal rates on the generated set")
    parser.add_argument("--output", type=Path, default=REFERENCE_PATH, help="where --calibrate writes")
    parser.add_argument("--reference", type=Path, default=REFERENCE_PATH, help="what --evaluate measures")
    parser.add_argument("--frontal-dir", type=Path, help="fit on these frontal films instead of phantoms")
    parser.add_argument("--frontal", type=int, default=200, help="held-out frontal phantoms per set (--evaluate)")
    parser.add_argument("--per-kind", type=int, default=50, help="negatives of each kind (--evaluate)")
    parser.add_argument("--json", type=Path, help="also write the evaluation as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from medgemma_xray.film_check import calibration

    if args.calibrate:
        if args.frontal_dir:
            reference = calibration.fit_reference(_films_in(args.frontal_dir), f"the films in {args.frontal_dir.name}")
        else:
            reference = calibration.fit_on_phantoms()
        args.output.write_text(reference.to_json() + "\n")
        logger.info("wrote %s (threshold %.2f)", args.output, reference.threshold)
        return 0
    evaluation = calibration.evaluate(load_reference(args.reference), args.frontal, args.per_kind)
    table = calibration.format_table(evaluation)
    sys.stdout.write(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"rows": evaluation.rows, "threshold": evaluation.threshold}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
