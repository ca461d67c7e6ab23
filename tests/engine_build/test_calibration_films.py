"""The engine build's calibration reader goes through the servers' film intake: only plausible frontal chest films
count (noise, a page of text and a photograph are skipped, each named with the reason), and a case library's
sidecar .json files are passed over without a word."""

from __future__ import annotations

import logging

from medgemma_xray.engine_build.calibration import load_calibration_films
from medgemma_xray.film_check.negatives import negative_film
from medgemma_xray.phantoms.films import png_bytes, quantize
from medgemma_xray.teaching.library import write_starter_set


def test_only_frontal_chest_films_are_counted_and_sidecars_pass_quietly(tmp_path, caplog):
    folder = tmp_path / "calib"
    write_starter_set(folder, 4)  # four labelled phantoms, each with its .json sidecar
    for kind in ("noise", "text", "natural"):
        (folder / f"{kind}.png").write_bytes(png_bytes(quantize(negative_film(kind, seed=9), 8)))
    with caplog.at_level(logging.WARNING, logger="medgemma_xray.engine_build.calibration"):
        films = load_calibration_films(folder)
    assert len(films.images) == 4 and len(films.names) == 4
    assert all(name.endswith((".dcm", ".png")) and not name.startswith(("noise", "text", "natural"))
               for name in films.names)  # fmt: skip
    skipped = {entry.split(":", 1)[0]: entry for entry in films.skipped}
    assert sorted(skipped) == ["natural.png", "noise.png", "text.png"]
    assert all("does not look like a frontal chest X-ray" in entry for entry in skipped.values())
    assert ".json" not in caplog.text and ".json" not in " ".join(films.skipped)
    assert all(image.size == (896, 896) and image.mode == "RGB" for image in films.images)
