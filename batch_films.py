"""Process a folder of chest films in batch: a structured report per film and/or MedGemma image features.

  python batch_films.py --input films/ --output results/ --task both [--mode trt --engine_path engines/x]
Writes results/summary.csv (one row per file, errors included), results/reports/*.md, results/features.npy
(N x 256 x hidden, float32) with results/features_index.csv. Exit status: 0 all films done; 1 some failed; 2 bad use.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--task", choices=["report", "features", "both"], default="report")
    parser.add_argument("--mode", choices=["pytorch", "trt"], default="pytorch")
    parser.add_argument("--model_path", type=Path)
    parser.add_argument("--engine_path", type=Path)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--max_new_tokens", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=8, help="films per vision batch for features")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if not args.input.is_dir():
        print(f"error: --input {args.input} is not a folder", file=sys.stderr)
        return 2

    from tqdm import tqdm

    from assistant.batch import film_files, process_folder
    from serving.factory import create_backend
    from serving.settings import Settings

    settings = Settings.from_env(model_path=args.model_path, engine_path=args.engine_path, device=args.device)
    backend = create_backend(args.mode, settings)
    try:
        info = backend.info()
        if info.is_demo:
            logging.warning("demo model with random weights: reports and features mean nothing")
        with tqdm(total=len(film_files(args.input)), desc="films", unit="film") as bar:
            result = process_folder(
                backend, args.input, args.output, reports=args.task in ("report", "both"),
                features=args.task in ("features", "both"), max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, progress=bar.update,
            )  # fmt: skip
    finally:
        backend.close()
    print(
        f"{result.processed} films done, {result.failed} failed, {result.skipped} skipped; see {args.output}/summary.csv"
    )
    return 1 if result.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
