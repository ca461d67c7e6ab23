"""Put the committed trained demo checkpoint where the app looks for its default model (models/medgemma-demo).

    python -m medgemma_xray.demo_model.install --output models/medgemma-demo

No download: the checkpoint is in the repository (demo_model/trained/). An older demo checkpoint in
the target (the random-weight one) is replaced; a folder that is not a demo checkpoint is never touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from pathlib import Path

from medgemma_xray.pytorch_backend.checkpoint import DEMO_MARKER, weights_sha256

logger = logging.getLogger(__name__)

TRAINED_CHECKPOINT_DIR = Path(__file__).resolve().parent / "trained"


def install_trained_checkpoint(output_dir: Path, source: Path = TRAINED_CHECKPOINT_DIR) -> Path:
    """Copy `source` into output_dir unless it already holds the same weights. Writes to a staging folder, then
    renames, so a reader never sees half a checkpoint (at worst, for an instant, none)."""
    output_dir, source = Path(output_dir), Path(source)
    if not (source / DEMO_MARKER).is_file():
        raise FileNotFoundError(f"{source} holds no trained demo checkpoint ({DEMO_MARKER} missing)")
    if output_dir.exists():
        if not (output_dir / DEMO_MARKER).is_file():
            raise FileExistsError(
                f"{output_dir} exists and is not a demo checkpoint; refusing to overwrite it. Point --output elsewhere."
            )
        if weights_sha256(output_dir) == weights_sha256(source) and _same_files(source, output_dir):
            return output_dir
    staging = output_dir.with_name(f".{output_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    if output_dir.exists():
        retired = output_dir.with_name(f".{output_dir.name}.{os.getpid()}.old")
        output_dir.rename(retired)
        staging.rename(output_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        try:
            staging.rename(output_dir)
        except OSError:  # another process (a parallel test worker) installed it first
            shutil.rmtree(staging, ignore_errors=True)
            if weights_sha256(output_dir) != weights_sha256(source):
                raise
            return output_dir
    logger.info("installed the trained demo checkpoint into %s", output_dir)
    return output_dir


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    return names == sorted(p.name for p in b.iterdir() if p.is_file()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("models/medgemma-demo"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_trained_checkpoint(args.output)
    print(f"demo checkpoint ready at {args.output} (trained on synthetic phantoms only; not a medical model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
