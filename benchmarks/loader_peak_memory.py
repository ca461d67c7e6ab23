"""Peak memory of loading one film, per encoding, and of refusing image bombs: this checkout against another.

  .venv/bin/python -m benchmarks.loader_peak_memory [--compare /path/to/older/checkout] [--output results.json]
Each load runs in a fresh child process (devtools.peak_memory: peak RSS above the file's own bytes, under a 3 GiB
address-space limit). Films are synthetic phantoms at 4300 x 3500 (a 43 cm detector at 0.1 mm). Prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

ROWS, COLUMNS = 4300, 3500


def cases() -> dict[str, tuple[bytes, bytes, int]]:
    """name: (file, a small file of the same kind to warm up on, stored bytes per pixel)."""
    from PIL import Image

    from devtools.hostile_files import dicom_deflated_bomb, dicom_jpeg_with_lying_size, dicom_rle_bomb, png_bomb
    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize

    big, small = chest_phantom(ROWS, COLUMNS, seed=2), chest_phantom(128, 112, seed=1)

    def jpeg(pixels) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
        return buffer.getvalue()

    def dicom(film, syntax, **extra) -> bytes:
        return dicom_bytes(quantize(film, 12), bits_stored=12, transfer_syntax=syntax, window=(2048, 4096), **extra)

    films = {
        "DICOM 16-bit explicit": (
            dicom_bytes(quantize(big, 16), bits_stored=16),
            dicom_bytes(quantize(small, 16), bits_stored=16),
            2,
        ),
        "DICOM 12-bit RLE, rescaled": (
            dicom(big, "rle-lossless", rescale=(2, -100)),
            dicom(small, "rle-lossless", rescale=(2, -100)),
            2,
        ),
        "DICOM 12-bit JPEG 2000": (dicom(big, "jpeg-2000-lossless"), dicom(small, "jpeg-2000-lossless"), 2),
        "DICOM 12-bit deflated": (
            dicom(big, "deflated-explicit-vr-little-endian"),
            dicom(small, "deflated-explicit-vr-little-endian"),
            2,
        ),
        "PNG 16-bit": (png_bytes(quantize(big, 16)), png_bytes(quantize(small, 16)), 2),
        "JPEG 8-bit": (jpeg(quantize(big, 8)), jpeg(quantize(small, 8)), 1),
    }
    warm_png, warm_dicom = png_bytes(quantize(small, 8)), dicom(small, "explicit-vr-little-endian")
    bombs = {
        "bomb: PNG 16-bit 13000x13000": (png_bomb(13000, 13000), warm_png, 0),
        "bomb: PNG 8-bit 30000x30000": (png_bomb(30000, 30000, 8), warm_png, 0),
        "bomb: DICOM deflated 16000x16000": (dicom_deflated_bomb(16000, 16000), warm_dicom, 0),
        "bomb: DICOM RLE 20000x20000": (dicom_rle_bomb(20000, 20000), warm_dicom, 0),
        "bomb: DICOM JPEG claiming 60000x60000": (dicom_jpeg_with_lying_size(), warm_dicom, 0),
    }
    return {**films, **bombs}


def main(argv: list[str] | None = None) -> int:
    from devtools.peak_memory import REPO_ROOT, peak_load_memory

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, help="another checkout (e.g. a worktree of an older commit)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    roots = {"this checkout": REPO_ROOT, **({"compared": args.compare.resolve()} if args.compare else {})}
    rows = []
    for name, (film, warm, bytes_per_pixel) in cases().items():
        row = {"case": name, "file_mb": len(film) / 1e6}
        for label, root in roots.items():
            outcome = peak_load_memory(film, warm, source_root=root)
            row[label] = outcome
        rows.append((row, bytes_per_pixel))
    header = f"{'case':34} {'file MB':>8}" + "".join(
        f" | {label + ': peak MiB (x pixels), outcome':>52}" for label in roots
    )
    print(header)
    for row, bytes_per_pixel in rows:
        line = f"{row['case']:34} {row['file_mb']:8.1f}"
        for label in roots:
            outcome = row[label]
            peak = outcome["peak_bytes"] / (1 << 20)
            multiple = f"({outcome['peak_bytes'] / (ROWS * COLUMNS * bytes_per_pixel):.1f}x)" if bytes_per_pixel else ""
            result = "loaded" if "loaded" in outcome else outcome.get("refused") or f"escaped {outcome['escaped']}"
            line += f" | {peak:10.0f} {multiple:>8} {result:>31}"
        print(line)
    if args.output:
        args.output.write_text(json.dumps([row for row, _ in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
