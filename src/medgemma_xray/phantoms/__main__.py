"""python -m medgemma_xray.phantoms: write a folder of labelled synthetic chest phantoms (films plus sidecar labels)."""

from __future__ import annotations

from pathlib import Path

from medgemma_xray.phantoms.films import SYNTHETIC_LABEL


def main(argv: list[str] | None = None) -> int:
    """python -m medgemma_xray.phantoms --output calib_dataset/synthetic --count 64 [--seed 0]"""
    import argparse

    from medgemma_xray.phantoms.labelled import write_labelled_set

    parser = argparse.ArgumentParser(
        description="Write labelled synthetic chest phantoms: PNG (even seeds) and 12-bit DICOM (odd seeds), each "
        "with a sidecar <name>.json of its findings, devices and technique (never in the DICOM patient fields)."
    )
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="first phantom seed; films use seeds seed..seed+count-1")
    args = parser.parse_args(argv)
    written = write_labelled_set(args.output, args.count, start_seed=args.seed)
    (args.output / "SYNTHETIC_README.txt").write_text(
        f"{SYNTHETIC_LABEL}. {len(written)} synthetic chest phantoms made by the phantoms package. Each film's "
        "findings are in the .json file of the same name. They exercise the pipeline and the demo model only: an "
        "engine calibrated on them has INT8 scales fit to phantoms, not to real films.\n"
    )
    print(f"wrote {len(written)} labelled synthetic phantom films to {args.output} ({SYNTHETIC_LABEL})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
