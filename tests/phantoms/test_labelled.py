"""Labelled phantoms: labels drawn from a seed, findings drawn where the labels say, visible at the model's input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pydicom
import pytest
from PIL import Image

from medgemma_xray.phantoms.__main__ import main as phantoms_cli
from medgemma_xray.phantoms.findings import (
    FINDINGS,
    SYNTHETIC_NOTICE,
    Effusion,
    EndotrachealTube,
    Heart,
    LungOpacity,
    Pacemaker,
    PhantomLabels,
    Pneumothorax,
    Technique,
    sample_labels,
)
from medgemma_xray.phantoms.labelled import FILM_HEIGHT_CM, labelled_phantom, read_labels, write_labelled_set
from medgemma_xray.xray_io import load_radiograph

PLAIN = PhantomLabels(seed=0, heart=Heart(0.42), technique=Technique(False, "adequate", "adequate"))


def film(seed: int, **findings) -> np.ndarray:
    return labelled_phantom(seed, 512, 448, labels=dataclasses.replace(PLAIN, seed=seed, **findings)).film


def test_labels_are_a_function_of_the_seed_and_round_trip_through_json():
    assert sample_labels(7) == sample_labels(7)
    assert sample_labels(7) != sample_labels(8)
    for seed in range(40):
        labels = sample_labels(seed)
        assert PhantomLabels.from_json(labels.to_json()) == labels
        assert json.loads(labels.to_json())["synthetic"] == SYNTHETIC_NOTICE


def test_every_finding_occurs_and_is_absent_often_enough_to_learn_and_score():
    labels = [sample_labels(seed) for seed in range(400)]
    for finding in FINDINGS:
        share = sum(label.present(finding) for label in labels) / len(labels)
        assert 0.15 < share < 0.6, (finding, share)
    assert any(label.pathology_free and not label.endotracheal_tube for label in labels)
    sides = {label.effusion.side for label in labels if label.effusion}
    assert sides == {"left", "right", "both"}
    for label in labels:  # a pneumothorax never shares its side with an effusion (no hydropneumothorax drawn)
        if label.effusion and label.pneumothorax:
            assert label.pneumothorax.side not in label.effusion.sides


def test_rendering_is_deterministic_and_in_range():
    first, second = labelled_phantom(11), labelled_phantom(11)
    assert np.array_equal(first.film, second.film) and first.labels == second.labels
    assert first.film.min() >= 0.0 and first.film.max() <= 1.0
    assert not np.array_equal(first.film, labelled_phantom(12, 512, first.film.shape[1]).film)


def test_left_effusion_whitens_the_viewers_right_base_only():
    """PA convention: the patient's left is on the viewer's right."""
    difference = film(3, effusion=Effusion("left", "moderate")) - film(3)
    changed = np.argwhere(difference > 0.1)
    assert len(changed) > 2000
    rows, cols = changed[:, 0] / 512, changed[:, 1] / 448
    assert cols.min() > 0.5 and rows.min() > 0.5  # right half of the image, lower half of the chest
    larger = film(3, effusion=Effusion("left", "large")) - film(3)
    assert (larger > 0.1).sum() > 1.5 * len(changed)  # a large effusion climbs higher than a moderate one


def test_pneumothorax_leaves_a_dark_space_without_lung_markings_and_a_pleural_line():
    with_air = film(4, pneumothorax=Pneumothorax("right", "large"))
    base = film(4)
    darker = (base - with_air) > 0.05
    rows, cols = np.nonzero(darker)
    assert darker.sum() > 1500 and cols.max() / 448 < 0.5  # the patient's right: the viewer's left

    def spread(values):  # interquartile range: lung markings, not the ribs that cross the space
        return np.subtract(*np.percentile(values, [75, 25]))

    between_ribs = darker & (base < 0.3)
    assert spread(with_air[between_ribs]) < 0.5 * spread(base[between_ribs])  # no markings beyond the line
    brighter = (with_air - base) > 0.1
    assert brighter.sum() > 100  # the visceral pleural line


def test_cardiothoracic_ratio_is_the_width_drawn():
    for ratio in (0.40, 0.62):
        image = film(5, heart=Heart(ratio))
        row = image[int(0.62 * 512)]
        heart = np.nonzero((row > 0.55) & (row < 0.7))[0]  # the heart's density, excluding spine and lungs
        width = (heart.max() - heart.min() + 1) / 448
        assert width / 0.70 == pytest.approx(ratio, abs=0.04)


def test_smallest_nodule_spans_several_patches_at_the_896_px_input():
    """1.5 cm at 512 rows, padded to square and resized to 896: at least two 14-px patches across."""
    with_nodule = film(6, nodule=LungOpacity("right upper lobe", 1.5))
    spot = np.abs(with_nodule - film(6)) > 0.15
    rows, cols = np.nonzero(spot)
    diameter_px = max(rows.max() - rows.min(), cols.max() - cols.min()) + 1
    assert diameter_px * 896 / 512 >= 2 * 14
    assert diameter_px == pytest.approx(1.5 / FILM_HEIGHT_CM * 512, rel=0.3)


def test_devices_are_radio_opaque_where_they_belong():
    tube = film(7, endotracheal_tube=EndotrachealTube(4.0))
    assert (tube[: int(0.15 * 512), 200:248] > 0.9).sum() > 100  # in the neck, on the midline
    left = film(7, pacemaker=Pacemaker("left"))
    generator = np.argwhere(left > 0.95)
    assert generator[:, 1].mean() / 448 > 0.6  # a left-sided generator: the viewer's right


def test_exposure_changes_the_whole_film():
    dark = film(8, technique=Technique(False, "adequate", "over"))
    bright = film(8, technique=Technique(False, "adequate", "under"))
    assert bright.mean() > film(8).mean() > dark.mean()


def test_cli_writes_png_and_dicom_with_sidecar_labels_never_in_patient_fields(tmp_path):
    assert phantoms_cli(["--output", str(tmp_path), "--count", "4", "--seed", "20"]) == 0
    films = sorted(p for p in tmp_path.iterdir() if p.suffix in (".png", ".dcm"))
    assert [p.suffix for p in films] == [".png", ".dcm", ".png", ".dcm"]
    for path in films:
        labels = read_labels(path)
        assert labels == sample_labels(int(path.stem.rsplit("_", 1)[1]))
        radiograph = load_radiograph(path.read_bytes())
        assert radiograph.pixels.shape[0] == 512
    dataset = pydicom.dcmread(films[1])
    assert dataset.ImageComments == SYNTHETIC_NOTICE and dataset.PatientID.startswith("SYNTHETIC-")
    patient_text = " ".join(str(dataset.get(k, "")) for k in ("PatientName", "PatientID", "PatientComments"))
    assert "effusion" not in patient_text.lower() and "{" not in patient_text
    assert float(dataset.PixelSpacing[0]) == pytest.approx(10 * FILM_HEIGHT_CM / 512)
    assert SYNTHETIC_NOTICE in (tmp_path / "SYNTHETIC_README.txt").read_text()
    with Image.open(films[0]) as png:
        assert png.text["Comment"] == SYNTHETIC_NOTICE


def test_write_labelled_set_returns_films_in_seed_order(tmp_path):
    written = write_labelled_set(tmp_path, 3, start_seed=5)
    assert [p.name for p in written] == [
        f"synthetic_phantom_00000{i}.{s}" for i, s in ((5, "dcm"), (6, "png"), (7, "dcm"))
    ]
