"""The film check: noise and text are refused, held-out frontal phantoms are not, and the
evaluation command prints the README's table."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.film_check import NotAChestFilmError, check_film, load_reference
from medgemma_xray.film_check.__main__ import main as film_check_main
from medgemma_xray.film_check.calibration import as_uploaded, auroc
from medgemma_xray.film_check.features import FEATURE_NAMES, film_features
from medgemma_xray.film_check.negatives import NEGATIVE_KINDS, negative_film
from medgemma_xray.phantoms.evaluation import held_out_phantoms
from medgemma_xray.xray_io import ImageInputError


def test_twenty_held_out_phantoms_pass():
    verdicts = [check_film(phantom.image) for phantom in held_out_phantoms(20, start_seed=500)]
    assert all(verdict.plausible for verdict in verdicts), [round(v.distance, 1) for v in verdicts]


@pytest.mark.parametrize("kind", ["noise", "text"])
def test_noise_and_text_are_refused(kind):
    for seed in range(3):
        verdict = check_film(as_uploaded(negative_film(kind, 1000 + seed)))
        assert not verdict.plausible, (kind, seed, verdict)
        assert "does not look like a frontal chest X-ray" in verdict.refusal()


def test_a_huge_noise_image_is_refused_from_its_pixels():
    pixels = np.random.default_rng(1).integers(0, 256, (6000, 6000), dtype=np.uint8)
    assert not check_film(pixels).plausible


def test_every_negative_kind_scores_above_every_held_out_phantom():
    frontal = [check_film(phantom.image).distance for phantom in held_out_phantoms(20, start_seed=700)]
    for kind in NEGATIVE_KINDS:
        others = [check_film(as_uploaded(negative_film(kind, 2000 + seed))).distance for seed in range(4)]
        assert auroc(frontal, others) == 1.0, (kind, max(frontal), min(others))


def test_refusal_is_an_image_input_error():
    assert issubclass(NotAChestFilmError, ImageInputError)  # the UI's one place for user errors shows it


def test_features_ignore_zero_padding():
    film = as_uploaded(negative_film("lateral", 3))
    padded = np.pad(film, ((0, 0), (200, 200)))
    assert np.allclose(film_features(film), film_features(padded))


def test_reference_matches_the_features():
    reference = load_reference()
    assert reference.mean.shape == (len(FEATURE_NAMES),) and reference.threshold > 0


def test_auroc_counts_ties_half():
    assert auroc([1, 2], [3, 4]) == 1.0 and auroc([1, 2], [0, 0.5]) == 0.0 and auroc([1], [1]) == 0.5


def test_evaluate_prints_the_table(capsys, tmp_path):
    assert film_check_main(["--evaluate", "--frontal", "4", "--per-kind", "2", "--json", str(tmp_path / "e.json")]) == 0
    table = capsys.readouterr().out
    assert "| all negatives | 12 |" in table and "AUROC" in table
    assert (tmp_path / "e.json").is_file()


def test_the_film_check_setting_names_its_choices():
    from medgemma_xray.serving.settings import Settings, SettingsError

    assert Settings.from_env({}).film_check == "refuse"
    assert Settings.from_env({"FILM_CHECK": "warn"}).film_check == "warn"
    with pytest.raises(SettingsError, match="refuse, warn, off|refuse.*warn.*off"):
        Settings.from_env({"FILM_CHECK": "maybe"})
