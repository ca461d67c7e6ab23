"""A /teaching session's records are bounded: a client that uploads and asks in a loop (the one-hour soak's teaching
user) added a record with a PNG thumbnail per question, for as long as its session lived. The session keeps its
last MAX_SESSION_CASES, and its exports number the kept cases as the session did."""

from __future__ import annotations

import csv
import io

import numpy as np

from medgemma_xray.phantoms.films import chest_phantom, quantize
from medgemma_xray.teaching.rounds import MAX_SESSION_CASES, Round, TeachingSession
from medgemma_xray.teaching.session_export import SessionInfo, session_csv, session_pdf
from medgemma_xray.teaching.viewer import DisplayFilm, ViewState, percentile_windows
from medgemma_xray.xray_io import Radiograph

ROUNDS = 150  # half again the bound: the old code kept all 150


def _round(seed: int) -> Round:
    pixels = quantize(chest_phantom(seed=seed), 8)
    overview = pixels.astype(np.float32)
    display = DisplayFilm(
        overview=overview,
        shape=pixels.shape,
        value_range=(float(overview.min()), float(overview.max())),
        default_window=(128.0, 256.0),
        pixel_spacing_mm=None,
        bits=8,
        source="PNG 8-bit",
        presets=percentile_windows(overview),
    )
    return Round(
        title=f"Uploaded film {seed + 1}",
        history="",
        film=Radiograph(pixels=pixels, source="PNG 8-bit"),
        display=display,
        model_image=None,
        view=ViewState.initial(display),
    )


def _session_after(rounds: int) -> TeachingSession:
    """Each round: a new film on screen, then a question answered (what records it), as the soak's client does."""
    session = TeachingSession()
    for seed in range(rounds):
        session = session.with_round(_round(seed % 7))
        current = session.current
        session = session.updated(_with_question(current, f"question {seed}"))
    return session


def _with_question(round_: Round, question: str) -> Round:
    from dataclasses import replace

    return replace(round_, questions=(*round_.questions, (question, "an answer")))


def test_a_long_session_keeps_its_last_cases_and_numbers_them_as_the_session_did():
    session = _session_after(ROUNDS)
    assert len(session.records) == MAX_SESSION_CASES, len(session.records)
    assert session.dropped == ROUNDS - MAX_SESSION_CASES
    assert session.records[-1].questions == ((f"question {ROUNDS - 1}", "an answer"),)
    # The thumbnails are most of a record: what the session holds no longer grows with its questions.
    held = sum(len(record.thumbnail) for record in session.records)
    assert held <= MAX_SESSION_CASES * 64 * 1024, held
    # A further question on the case on screen updates its record in place, wherever the front has moved to.
    again = session.updated(_with_question(session.current, "one more"))
    assert len(again.records) == MAX_SESSION_CASES and again.dropped == session.dropped
    assert again.records[-1].questions[-1] == ("one more", "an answer")

    info = SessionInfo(student="A student", first_case=session.dropped + 1)
    rows = list(csv.DictReader(io.StringIO(session_csv(list(session.records), (), info))))
    assert [row["case"] for row in (rows[0], rows[-1])] == [str(ROUNDS - MAX_SESSION_CASES + 1), str(ROUNDS)]
    pdf = session_pdf(list(session.records[-2:]), (), info=SessionInfo(first_case=ROUNDS - 1))
    assert pdf.startswith(b"%PDF")


def test_a_short_session_keeps_every_case():
    session = _session_after(5)
    assert len(session.records) == 5 and session.dropped == 0
    rows = list(csv.DictReader(io.StringIO(session_csv(list(session.records)))))
    assert [row["case"] for row in rows] == ["1", "2", "3", "4", "5"]
