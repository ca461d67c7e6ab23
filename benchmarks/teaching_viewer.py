"""How fast the teaching viewer answers a window/level, zoom or click: in process, and through the page's API.

  .venv/bin/python -m benchmarks.teaching_viewer [--repeats 20] [--output results.json]
In process: medgemma_xray.teaching.viewer.render_view plus the PNG encoding web.teaching_page does (zlib level 1), per action, on
12-bit DICOM phantoms at 2500 x 2048 (a 40 cm film at 0.16 mm) and 4300 x 3500 (43 cm at 0.1 mm). Through the
API: a real server (python app.py, the demo model) with a one-case library holding the 4300 x 3500 film,
driven with gradio_client: the time from the call until the client holds the new picture (gradio_client fetches
the PNG before it returns). Prints a table of medians and 90th percentiles in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = ((2500, 2048), (4300, 3500))


def _film(rows: int, cols: int) -> bytes:
    from medgemma_xray.phantoms.films import dicom_bytes, quantize
    from medgemma_xray.phantoms.labelled import labelled_phantom

    film = labelled_phantom(3, rows, cols).film
    return dicom_bytes(quantize(film, 12), bits_stored=12, window=(2048, 4096), pixel_spacing_mm=400 / rows)


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered),
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "n": len(ordered),
    }


def in_process(repeats: int) -> dict:
    import io

    from PIL import Image

    from medgemma_xray.intake import FilmIntake, IntakeConfig
    from medgemma_xray.teaching.viewer import ViewState, click, display_film, render_view

    intake = FilmIntake(IntakeConfig(film_check="off", max_bytes=1 << 28))
    results = {}
    for rows, cols in SIZES:
        intake_film, values = intake.read_with_values(_film(rows, cols))  # as the teaching page reads an upload
        film = display_film(values, intake_film.source, intake_film.key)
        base = ViewState.initial(film)
        states = {
            "preset lung": base.with_window(*film.preset("lung")),
            "preset bone": base.with_window(*film.preset("bone")),
            "zoom x2": base.zoomed(2),
            "zoom x8": base.zoomed(8),
            "ruler click": click(film, base, 300, 300),
        }
        for name, state in states.items():
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                picture, _ = render_view(film, state, full=values.values)  # the page's zoomed views read it
                Image.fromarray(picture).save(io.BytesIO(), format="PNG", compress_level=1)  # as web.teaching_page does
                samples.append((time.perf_counter() - started) * 1000)
            results[f"{rows}x{cols} {name}"] = _summary(samples)
    return results


def through_api(repeats: int) -> dict:
    from gradio_client import Client

    from medgemma_xray.teaching.library import CASE_FORMAT

    with tempfile.TemporaryDirectory() as folder:
        library = Path(folder) / "library"
        library.mkdir()
        (library / "big.dcm").write_bytes(_film(*SIZES[1]))
        record = {"case_format": CASE_FORMAT, "title": "Large film", "history": "benchmark", "key": None}
        (library / "big.case.json").write_text(json.dumps(record))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "CASE_LIBRARY": str(library), "LOG_DIR": str(Path(folder) / "logs")}
        server = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(360):
                try:
                    if urllib.request.urlopen(f"{url}/readyz", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.5)
            client = Client(url, verbose=False)
            client.predict(api_name="/teaching_cases")  # the session's library list, as the page's load gives it
            client.predict("big", api_name="/teaching_open_case")
            results = {}
            for name, endpoint in (
                ("preset lung", "/teaching_window_lung"),
                ("preset bone", "/teaching_window_bone"),
                ("zoom in", "/teaching_zoom_in"),
            ):
                samples = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    client.predict(api_name=endpoint)
                    samples.append((time.perf_counter() - started) * 1000)
                results[f"4300x3500 via API {name}"] = _summary(samples)
            client.predict(api_name="/teaching_reset")
            # A drag's release or a typed window: a new level each time (no cached view), then windows seen before.
            for name, levels in (
                ("new window (a drag's release)", range(repeats)),
                ("a window seen before", [0] * repeats),
            ):
                samples = []
                for step in levels:
                    started = time.perf_counter()
                    client.predict(1500.0 + 10 * step, 2000.0, api_name="/teaching_window")
                    samples.append((time.perf_counter() - started) * 1000)
                results[f"4300x3500 via API {name}"] = _summary(samples)
            return results
        finally:
            server.terminate()
            server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    results = {**in_process(args.repeats), **through_api(args.repeats)}
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    print("| action | median ms | p90 ms |\n|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
