"""Pointing on /teaching without a server: the student's marks (teaching.marks), their per-finding score
(teaching.mark_scoring: presence, side, zone, overlap, exactly at the stated tolerances), the model's answer as
boxes or a notice (teaching.model_location), the overlays drawn into the viewer's picture (teaching.overlays), and
the marks' cells in the session CSV and PDF (teaching.session_export)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medgemma_xray.grounding.boxes import FilmBox, final_answer, to_model
from medgemma_xray.phantoms.findings import Effusion, Heart, LungOpacity, Pacemaker, PhantomLabels, Technique
from medgemma_xray.phantoms.regions import Region, finding_regions
from medgemma_xray.teaching.mark_scoring import (
    IOU_HIT,
    POINT_MARGIN,
    TOLERANCES_TEXT,
    ZONE_BANDS,
    score_marks,
    side_of,
    zone_of,
)
from medgemma_xray.teaching.marks import MAX_MARKS, Mark, ModelLocation, Pointing, finding_name
from medgemma_xray.teaching.model_location import localises, location_from_answer
from medgemma_xray.teaching.overlays import COLOURS, Layers, draw_layers
from medgemma_xray.teaching.pointing_report import marks_cell, score_pointing
from medgemma_xray.teaching.viewer import ViewState, view_crop

TECHNIQUE = Technique(rotated=False, inspiration="adequate", exposure="adequate")
# A key with a right effusion and a left pacemaker (no cardiomegaly), and the regions a phantom would give it.
KEY = PhantomLabels(
    seed=1, heart=Heart(0.45), technique=TECHNIQUE, effusion=Effusion("right", "small"), pacemaker=Pacemaker("left")
)
EFFUSION = Region("pleural_effusion", "right", "lower", FilmBox("right pleural effusion", 0.60, 0.15, 0.80, 0.45))
PACEMAKER = Region("pacemaker", "left", None, FilmBox("left pacemaker", 0.10, 0.70, 0.30, 0.90))
REGIONS = (EFFUSION, PACEMAKER)


def by_finding(scores):
    return {score.finding: score for score in scores}


def test_the_key_regions_marked_exactly_score_every_check_right():
    marks = [Mark.box("pleural_effusion", (0.60, 0.15), (0.80, 0.45)), Mark.point("pacemaker", 0.2, 0.8)]
    scores = by_finding(score_marks(marks, KEY, REGIONS))
    assert list(scores) == ["pleural_effusion", "pacemaker"]
    effusion, pacemaker = scores["pleural_effusion"], scores["pacemaker"]
    assert (effusion.right, effusion.scored) == (4, 4)
    assert effusion.side.key == "right" and effusion.zone.key == "lower" and "IoU 1.00" in effusion.overlap.marked
    assert (pacemaker.right, pacemaker.scored) == (3, 3)  # a device has no zone: not scored
    assert pacemaker.zone.right is None


def test_presence_side_zone_and_overlap_each_fail_on_their_own():
    # The effusion boxed on the wrong side, high up, overlapping nothing; the pacemaker not claimed; a heart
    # claimed that the key does not have.
    marks = [Mark.box("pleural_effusion", (0.20, 0.60), (0.35, 0.85)), Mark.point("cardiomegaly", 0.55, 0.5)]
    scores = by_finding(score_marks(marks, KEY, REGIONS))
    effusion = scores["pleural_effusion"]
    assert effusion.presence.right is True
    assert (effusion.side.right, effusion.side.marked) == (False, "left")
    assert (effusion.zone.right, effusion.zone.marked) == (False, "upper")
    assert effusion.overlap.right is False and effusion.overlap.marked == "missed (IoU 0.00)"
    assert scores["pacemaker"].presence.right is False and scores["pacemaker"].scored == 1
    assert scores["cardiomegaly"].presence.key == "absent" and scores["cardiomegaly"].presence.right is False


@pytest.mark.parametrize(
    ("box", "hit"),
    [
        # IoU exactly 0.3: the key box (0.2 x 0.3 = 0.06) and a box sharing 0.2 x 0.15 of it... computed below
        (((0.60, 0.15), (0.80, 0.45)), True),  # IoU 1
        (((0.60, 0.15), (0.80, 0.24)), True),  # IoU 0.09 / 0.3 = 0.3 exactly: counts
        (((0.60, 0.15), (0.80, 0.2399)), False),  # just under
    ],
)
def test_a_box_counts_at_iou_0_3_and_not_below(box, hit):
    scores = by_finding(score_marks([Mark.box("pleural_effusion", *box)], KEY, REGIONS))
    assert scores["pleural_effusion"].overlap.right is hit
    assert IOU_HIT == 0.3


@pytest.mark.parametrize(
    ("point", "hit"),
    [
        ((0.70, 0.30), True),  # inside
        ((0.85, 0.30), True),  # 0.05 below the region: on the grown edge
        ((0.851, 0.30), False),
        ((0.70, 0.099), False),  # 0.051 left of it
    ],
)
def test_a_point_counts_inside_the_region_grown_by_5_percent(point, hit):
    scores = by_finding(score_marks([Mark.point("pleural_effusion", *point)], KEY, REGIONS))
    assert scores["pleural_effusion"].overlap.right is hit
    assert POINT_MARGIN == 0.05 and "5%" in TOLERANCES_TEXT and "0.3" in TOLERANCES_TEXT


def test_a_bilateral_effusion_needs_a_mark_on_each_side():
    key = PhantomLabels(seed=1, heart=Heart(0.45), technique=TECHNIQUE, effusion=Effusion("both", "small"))
    left = Region("pleural_effusion", "left", "lower", FilmBox("left pleural effusion", 0.60, 0.55, 0.80, 0.85))
    regions = (EFFUSION, left)
    one = by_finding(score_marks([Mark.point("pleural_effusion", 0.7, 0.3)], key, regions))["pleural_effusion"]
    assert one.side.right is False and one.side.key == "left and right" and one.overlap.right is False
    both = [Mark.point("pleural_effusion", 0.7, 0.3), Mark.point("pleural_effusion", 0.7, 0.7)]
    scored = by_finding(score_marks(both, key, regions))["pleural_effusion"]
    assert (scored.right, scored.scored) == (4, 4)


def test_a_teachers_key_without_regions_scores_presence_and_side_only():
    key = PhantomLabels(seed=0, heart=Heart(0.45), technique=TECHNIQUE, nodule=LungOpacity("left upper lobe", 2.0))
    scores = by_finding(score_marks([Mark.point("nodule_or_mass", 0.3, 0.7)], key, None))
    nodule = scores["nodule_or_mass"]
    assert nodule.presence.right and nodule.side.right and nodule.side.key == "left"
    assert nodule.zone.right is None and nodule.overlap.right is None and "no key region" in nodule.overlap.key


def test_side_and_zone_bands():
    assert side_of(Mark.point("x", 0.5, 0.49)) == "right" and side_of(Mark.point("x", 0.5, 0.5)) == "left"
    assert [zone_of(y) for y in (ZONE_BANDS[0] - 1e-6, ZONE_BANDS[0], ZONE_BANDS[1])] == ["upper", "middle", "lower"]


@settings(max_examples=12, deadline=None)
@given(st.integers(min_value=900_000, max_value=900_400))
def test_marking_every_phantom_region_exactly_scores_all_right(seed):
    from medgemma_xray.phantoms.findings import sample_labels

    key = sample_labels(seed)
    regions = finding_regions(key, 256, 200)
    marks = [Mark.box(r.finding, (r.box.y0, r.box.x0), (r.box.y1, r.box.x1)) for r in regions]
    for score in score_marks(marks, key, regions):
        assert score.right == score.scored, (seed, score)


@given(st.floats(0, 1, allow_nan=False), st.floats(0, 1, allow_nan=False), st.floats(0, 1), st.floats(0, 1))
def test_a_box_mark_is_ordered_inside_the_film_whatever_the_corners(y0, x0, y1, x1):
    if y0 == y1 or x0 == x1:
        with pytest.raises(ValueError):
            Mark.box("pleural_effusion", (y0, x0), (y1, x1))
        return
    mark = Mark.box("pleural_effusion", (y0, x0), (y1, x1))
    assert 0 <= mark.y0 < mark.y1 <= 1 and 0 <= mark.x0 < mark.x1 <= 1 and mark.kind == "box"


def test_marks_are_limited_and_locked_at_reveal():
    pointing = Pointing()
    for _ in range(MAX_MARKS):
        pointing = pointing.with_mark(Mark.point("pacemaker", 0.2, 0.8))
    with pytest.raises(ValueError, match="At most"):
        pointing.with_mark(Mark.point("pacemaker", 0.2, 0.8))
    locked = Pointing(marks=(Mark.point("pacemaker", 0.2, 0.8),), locked=True)
    with pytest.raises(ValueError, match="locked"):
        locked.with_mark(Mark.point("pacemaker", 0.2, 0.8))
    with pytest.raises(ValueError, match="locked"):
        locked.without_mark(0)
    assert Pointing(marks=locked.marks).without_mark(0).marks == ()


def test_finding_names():
    assert finding_name("pleural effusion") == "pleural_effusion" and finding_name("Nodule or mass") == "nodule_or_mass"
    assert finding_name("  rib   fracture ") == "rib fracture"
    with pytest.raises(ValueError, match="Pick a finding"):
        finding_name("  ")


def test_the_models_answer_becomes_boxes_or_a_notice():
    rows, cols = 512, 400
    box = FilmBox("right pleural effusion", 0.6, 0.15, 0.8, 0.45)
    answer = "Reasoning...\n" + final_answer([("right pleural effusion", to_model(box, rows, cols))])
    located = location_from_answer("pleural_effusion", answer, (rows, cols))
    assert located.notice == "" and len(located.boxes) == 1
    assert np.allclose([located.boxes[0].y0, located.boxes[0].x1], [0.6, 0.45], atol=0.01)
    none = location_from_answer("pleural_effusion", "I cannot see an effusion.", (rows, cols))
    assert none.boxes == () and none.notice.startswith("The model did not locate the pleural effusion")
    empty = location_from_answer("pacemaker", "Final Answer: []", (rows, cols))
    assert empty.boxes == () and "no box" in empty.notice
    bad = location_from_answer(
        "pacemaker", 'Final Answer: [{"box_2d": [900, 10, 100, 20], "label": "x"}]', (rows, cols)
    )
    assert bad.boxes == () and "Left out" in bad.notice and "y0 < y1" in bad.notice
    assert location_from_answer("pacemaker", answer, (rows, cols), stopped=True).notice.startswith("Stopped")


def test_the_capability_is_read_from_the_backend_info():
    from dataclasses import replace

    from medgemma_xray.inference_api.types import BackendInfo, Mode
    from medgemma_xray.teaching.model_location import not_localising

    info = BackendInfo(Mode.PYTORCH, "fp32", "cpu", "transformers", "google/medgemma-4b-it", is_demo=False)
    assert not localises(info) and not localises(None)
    assert localises(replace(info, capabilities=frozenset({"localisation"})))
    assert "does not localise findings" in not_localising(info) and "medgemma-1.5-4b-it" in not_localising(info)


def _picture(rows=400, cols=300):
    return np.full((rows, cols), 128, dtype=np.uint8)


def test_each_layer_is_drawn_in_its_colour_where_its_box_is():
    shape = (400, 300)
    crop = view_crop(shape, ViewState(centre=0, width=1), view_max=400)
    layers = Layers(
        key=(("pleural_effusion", FilmBox("k", 0.5, 0.1, 0.9, 0.45)),),
        student=(Mark.box("pleural_effusion", (0.55, 0.15), (0.85, 0.4)),),
        model=(("pleural_effusion", FilmBox("m", 0.2, 0.55, 0.4, 0.9)),),
    )
    drawn = draw_layers(_picture(), crop, shape, layers)
    assert drawn.shape == (400, 300, 3)

    def colour_at_column(x: int, y0: int, y1: int, layer: str) -> bool:
        column = drawn[y0:y1, x - 1 : x + 2].reshape(-1, 3)
        return bool((column == COLOURS[layer]).all(axis=1).any())

    # The key box's left edge at x = 0.1 * 300 = 30, rows 200..360; the student's at x = 45; the model's at 165.
    assert colour_at_column(30, 260, 340, "key")
    assert colour_at_column(45, 240, 320, "student")
    assert colour_at_column(165, 100, 150, "model")
    assert not colour_at_column(165, 200, 380, "model")  # nothing of the model's where it drew nothing
    # Zoomed in 2x on the top-left quarter: the key box's left edge moves to x = 60.
    zoomed = view_crop(shape, ViewState(centre=0, width=1, zoom=2.0, focus=(0.5, 0.25)), view_max=400)
    again = draw_layers(_picture(), zoomed, shape, Layers(key=layers.key))
    column = again[150:300, 59:62].reshape(-1, 3)
    assert (column == COLOURS["key"]).all(axis=1).any()


def test_no_layers_draws_nothing_and_layers_know_what_they_hold():
    assert not Layers() and Layers(student=(Mark.point("pacemaker", 0.5, 0.5),)).drawn() == ("student",)


def test_the_marks_cell_and_the_pointing_table():
    marks = (Mark.box("pleural_effusion", (0.6, 0.15), (0.8, 0.45)), Mark.point("pacemaker", 0.2, 0.8))
    assert marks_cell(marks) == (
        "pleural effusion box y0=0.600 x0=0.150 y1=0.800 x1=0.450 | pacemaker point y=0.200 x=0.800"
    )
    pointing = Pointing(
        marks=marks,
        model=(ModelLocation("pleural_effusion", (FilmBox("m", 0.62, 0.16, 0.79, 0.44),)),),
        key_regions=REGIONS,
        model_asked=True,
    )
    scores = score_pointing(pointing, KEY, model_asked=True)
    rows = scores.rows()
    assert rows[0] == ("pleural effusion", "presence", "present", "claimed (right)", "claimed (right)")
    assert scores.student_summary() == "7/7 checks right on 2 finding(s)"
    # The model did not locate the pacemaker: its presence is wrong there.
    assert scores.model_summary() == "4/5 checks right on 2 finding(s)"
    assert score_pointing(pointing, KEY, model_asked=False).model_summary().startswith("not asked")


def test_the_session_csv_and_pdf_carry_the_marks_and_the_pointing_score(tmp_path):
    import csv
    import io
    import shutil
    import subprocess

    from medgemma_xray.teaching.session_export import CaseRecord, session_csv, session_pdf

    pointing = Pointing(
        marks=(Mark.box("pleural_effusion", (0.6, 0.15), (0.8, 0.45)), Mark.point("pacemaker", 0.2, 0.8)),
        model=(ModelLocation("pleural_effusion", (FilmBox("m", 0.62, 0.16, 0.79, 0.44),)),),
        key_regions=REGIONS,
        model_asked=True,
        locked=True,
    )
    record = CaseRecord(title="Case A", key=KEY, student_read={}, model_read={}, pointing=pointing)
    unmarked = CaseRecord(title="Case B", key=KEY, student_read={}, model_read={})
    rows = list(csv.DictReader(io.StringIO(session_csv([record, unmarked]))))
    assert rows[0]["student_marks"] == marks_cell(pointing.marks)
    assert rows[0]["model_boxes"] == "pleural effusion box y0=0.620 x0=0.160 y1=0.790 x1=0.440"
    assert rows[0]["student_pointing_score"] == "7/7 checks right on 2 finding(s)"
    assert rows[0]["model_pointing_score"] == "4/5 checks right on 2 finding(s)"
    assert all(rows[1][name] == "" for name in ("student_marks", "model_boxes", "student_pointing_score"))
    if not shutil.which("pdftotext"):
        pytest.fail("pdftotext is missing: scripts/setup_env.sh --dev installs poppler-utils")
    pdf = tmp_path / "session.pdf"
    pdf.write_bytes(session_pdf([record, unmarked]))
    text = " ".join(
        subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "Pointing: student 7/7 checks right on 2 finding(s); model 4/5 checks right" in text
    assert "pleural effusion box y0=0.600" in text and "Overlap counts at IoU >= 0.3" in text
