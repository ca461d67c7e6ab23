"""The box format's round trip and its refusals: what the model writes maps onto the film it was shown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medgemma_xray.grounding.boxes import BoxFormatError, FilmBox, from_model, iou, parse_boxes, to_model
from medgemma_xray.grounding.prompts import localisation_prompt, strip_thinking


@given(
    rows=st.integers(200, 5000),
    cols=st.integers(200, 5000),
    y0=st.floats(0, 0.8),
    x0=st.floats(0, 0.8),
    h=st.floats(0.1, 0.2),
    w=st.floats(0.1, 0.2),
)
def test_a_film_box_survives_the_model_frame_within_a_thousandth_of_the_square(rows, cols, y0, x0, h, w):
    box = FilmBox("effusion", y0, x0, y0 + h, x0 + w)
    back = from_model("effusion", to_model(box, rows, cols), rows, cols)
    side = max(rows, cols)
    for a, b, length in ((box.y0, back.y0, rows), (box.x0, back.x0, cols), (box.y1, back.y1, rows)):
        assert abs(a - b) * length <= side / 1000 + 1e-6


def test_the_padding_is_removed_on_a_portrait_film():
    # 2000 rows x 1000 cols: the square is 2000 wide, the film starts at column 500 (250 of 1000).
    box = from_model("nodule", [0, 250, 500, 750], rows=2000, cols=1000)
    assert (box.y0, box.x0, box.y1, box.x1) == (0.0, 0.0, 0.5, 1.0)


def test_the_notebook_answer_parses_and_bad_items_are_refused_with_a_reason():
    answer = (
        'The effusion blunts the right angle.\nFinal Answer: ```json[{"box_2d": [600, 100, 900, 450], '
        '"label": "pleural effusion"}, {"box_2d": [900, 10, 100, 20], "label": "x"}, '
        '{"box_2d": [1, 2, 3]}, "text"]```'
    )
    parsed = parse_boxes(answer, rows=1000, cols=1000)
    assert [b.label for b in parsed.boxes] == ["pleural effusion"]
    assert parsed.boxes[0].y0 == pytest.approx(0.6) and parsed.boxes[0].x1 == pytest.approx(0.45)
    assert len(parsed.refused) == 3 and "y0 < y1" in parsed.refused[0] and "four numbers" in parsed.refused[1]


@pytest.mark.parametrize("answer", ["No boxes here.", "Final Answer: [{", 'Final Answer: {"box_2d": 1}', "[" * 5000])
def test_an_answer_without_a_box_list_is_a_format_error_not_a_crash(answer):
    with pytest.raises(BoxFormatError):
        parse_boxes(answer, 100, 100)


def test_a_box_wholly_in_the_padding_is_refused():
    parsed = parse_boxes('Final Answer: [{"box_2d": [0, 0, 100, 100], "label": "x"}]', rows=2000, cols=1000)
    assert parsed.boxes == () and "padding" in parsed.refused[0]


def test_iou():
    a = FilmBox("a", 0.0, 0.0, 0.5, 0.5)
    assert iou(a, a) == pytest.approx(1.0)
    assert iou(a, FilmBox("b", 0.25, 0.25, 0.75, 0.75)) == pytest.approx(0.0625 / 0.4375)
    assert iou(a, FilmBox("c", 0.6, 0.6, 0.9, 0.9)) == 0.0


def test_the_prompt_is_the_notebooks_with_the_object_named_and_thinking_is_stripped():
    prompt = localisation_prompt(" pleural effusion ")
    assert "Where is the pleural effusion? Don't give a final answer without reasoning." in prompt
    assert '```json[{"box_2d": [800, 3, 840, 471], "label": "car"}' in prompt
    assert strip_thinking("<unused94>thought: hmm<unused95>Final Answer: []") == "Final Answer: []"
