"""The tolerant report parser: the trained format, what real models write instead, and any string at all."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medgemma_xray.assistant.report import FIELD_ALIASES, parse_report, report_request
from medgemma_xray.assistant.report_schema import REPORT_FIELDS, REPORT_PROMPT

KEYS = [f.key for f in REPORT_FIELDS]
WELL_FORMED = (
    "View: PA\n"
    "Technique: adequate inspiration, no rotation\n"
    "Lungs: clear, no focal consolidation\n"
    "Pleura: no effusion or pneumothorax\n"
    "Heart and mediastinum: normal cardiac size, mediastinum not widened\n"
    "Bones: no acute fracture\n"
    "Lines and devices: none\n"
    "Impression: no acute cardiopulmonary abnormality"
)


def test_the_trained_format_fills_every_field():
    report = parse_report(WELL_FORMED)
    assert report.unfilled == () and report.unparsed == "" and report.raw_text == WELL_FORMED
    assert report.fields["view"] == "PA"
    assert report.fields["heart_mediastinum"] == "normal cardiac size, mediastinum not widened"
    assert report.fields["impression"] == "no acute cardiopulmonary abnormality"
    assert list(report.fields) == KEYS
    for key, ranges in report.spans.items():
        assert "\n".join(WELL_FORMED[start:end] for start, end in ranges) == report.fields[key]


def test_markdown_bold_headings_bullets_case_dashes_and_missing_colons():
    text = (
        "Here is the report.\n\n"
        "**View:** PA\n"
        "__TECHNIQUE__: slightly rotated\n"
        "## Lungs\n"
        "- Clear.\n"
        "- No nodules.\n\n"
        "1. **Pleura** - no effusion\n"
        "* **Heart and Mediastinum:** normal\n"
        "**Bones and soft tissues:** intact\n"
        "Lines and devices none\n"
        "### Impression\n"
        "Normal chest."
    )
    report = parse_report(text)
    assert report.fields == {
        "view": "PA",
        "technique": "slightly rotated",
        "lungs": "Clear.\n- No nodules.",
        "pleura": "no effusion",
        "heart_mediastinum": "normal",
        "bones": "intact",
        "lines_devices": "none",
        "impression": "Normal chest.",
    }
    assert report.unparsed == "Here is the report." and report.unfilled == ()


def test_fields_out_of_order_repeated_inline_and_missing():
    text = "Impression: normal. Lungs: clear; View: AP\nLungs: also no nodules\nPleura:\nCardiomediastinal silhouette: normal"
    report = parse_report(text)
    assert report.fields["impression"] == "normal."
    assert report.fields["lungs"] == "clear\nalso no nodules"  # written twice: both parts kept, in order
    assert report.fields["view"] == "AP"
    assert report.fields["heart_mediastinum"] == "normal"
    assert report.unfilled == ("technique", "pleura", "bones", "lines_devices")  # "Pleura:" with nothing after it


def test_free_text_fills_nothing_and_keeps_every_word():
    for text in (
        "The lungs are clear. Heart size is normal. No effusion.",
        "Lungs, heart and bones look normal to me.",
        "TheTheTheTheThe",
        "",
        "   \n\n ",
    ):
        report = parse_report(text)
        assert report.unfilled == tuple(KEYS) and report.filled == ()
        assert report.raw_text == text and report.unparsed == text.strip()


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_never_raises_on_any_string_and_never_invents_text(text):
    report = parse_report(text)
    assert report.raw_text == text and list(report.fields) == KEYS
    assert report.unfilled == tuple(key for key in KEYS if not report.fields[key])
    for key, ranges in report.spans.items():
        assert "\n".join(text[start:end] for start, end in ranges) == report.fields[key]
        assert all(0 <= start < end <= len(text) for start, end in ranges)


PIECES = [alias for aliases in FIELD_ALIASES.values() for alias in aliases] + list("#*:-_\n .,;`|–") + ["**", "__"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES + [p.upper() for p in PIECES]), max_size=60).map("".join))
def test_never_raises_on_label_like_noise(text):
    report = parse_report(text)
    assert report.raw_text == text and list(report.fields) == KEYS
    for key, ranges in report.spans.items():
        assert "\n".join(text[start:end] for start, end in ranges) == report.fields[key]


VALUES = st.text(alphabet="abcdefghij klmnop 0123456789.,()", min_size=1, max_size=40).filter(
    lambda value: value.strip(" .,")
)
STYLES = (
    "{label}: {value}",
    "**{label}:** {value}",
    "{upper}: {value}",
    "- **{label}**: {value}",
    "## {label}\n{value}",
    "{label} - {value}",
)


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(REPORT_FIELDS)), st.lists(VALUES, min_size=8, max_size=8), st.sampled_from(STYLES))
def test_any_order_and_style_round_trips(order, values, style):
    lines = [
        style.format(label=spec.label, upper=spec.label.upper(), value=value)
        for spec, value in zip(order, values, strict=True)
    ]
    report = parse_report("\n".join(lines))
    for spec, value in zip(order, values, strict=True):
        assert report.fields[spec.key] == value.lstrip(" ").rstrip(" ,;"), (spec.key, lines)


def test_confidence_per_field_from_the_tokens_that_wrote_it():
    # Tokens as a backend reports them: each token's text, concatenating to the answer.
    texts = ["View", ":", " PA", "\n", "Lungs", ":", " hazy", " left", " base", "\n", "Impression", ":", " pneumonia"]
    probabilities = [0.99, 0.99, 0.9, 0.99, 0.99, 0.99, 0.3, 0.6, 0.8, 0.99, 0.99, 0.99, 0.5]

    class Stats:
        token_ids = list(range(len(texts)))
        token_logprobs = [math.log(p) for p in probabilities]
        token_texts = texts

    report = parse_report("".join(texts), Stats())
    assert report.fields["lungs"] == "hazy left base"
    assert report.confidence["view"].mean_probability == pytest.approx(0.9)
    lungs = report.confidence["lungs"]
    assert lungs.tokens == 3 and lungs.mean_probability == pytest.approx((0.3 * 0.6 * 0.8) ** (1 / 3))
    assert lungs.min_probability == pytest.approx(0.3) and lungs.lowest_span == "hazy left base"
    assert report.confidence["impression"].mean_probability == pytest.approx(0.5)
    assert set(report.confidence) == {"view", "lungs", "impression"}  # unfilled fields have none
    assert report.overall.tokens == len(texts)
    # A flushed tail the tokens did not record (an incomplete character at the end) still lines up.
    assert parse_report("".join(texts) + "\ufffd", Stats()).confidence.keys() == report.confidence.keys()
    # Text that is not the tokens' text gets no per-field confidence (the overall one is still the tokens').
    unrelated = parse_report("Lungs: clear", Stats())
    assert unrelated.confidence == {} and unrelated.overall is not None


def test_the_report_request_uses_the_schema_prompt():
    request = report_request(image=None, max_new_tokens=64)
    assert request.turns[-1].text == REPORT_PROMPT and request.max_new_tokens == 64
    request.validate()


def test_under_a_heading_a_line_starting_with_a_label_word_is_text_not_a_new_field():
    report = parse_report("## Impression\nBone density is normal.\nLungs clear\n\n**Lungs**\nclear")
    assert report.fields["impression"] == "Bone density is normal.\nLungs clear"
    assert report.fields["bones"] == "" and report.fields["lungs"] == "clear"
    one_per_line = parse_report("View: PA\nLungs clear\nbone\nImpression: normal")
    assert one_per_line.fields["lungs"] == "clear\nbone"  # a lone word is text, never a heading
    assert one_per_line.fields["impression"] == "normal"
