"""Stop flags by browser session (web/answer_stops.py): a Stop reaches every answer of its own session and
no other, and an ended answer leaves nothing behind."""

from __future__ import annotations

import threading

from medgemma_xray.web.answer_stops import AnswerStops


def test_stop_reaches_the_sessions_answers_and_no_other():
    stops = AnswerStops()
    with stops.answering("alice") as report, stops.answering("alice") as question, stops.answering("bob") as bob:
        assert stops.running() == 3
        assert stops.stop("alice") == 2
        assert report.is_set() and question.is_set()
        assert not bob.is_set()
    assert stops.running() == 0
    assert stops.stop("alice") == 0, "a Stop after the answer ended has nothing to stop"


def test_a_stop_before_an_answer_starts_does_not_stop_it():
    """Stop pressed with nothing streaming is not remembered: the next question runs to its end."""
    stops = AnswerStops()
    assert stops.stop("alice") == 0
    with stops.answering("alice") as flag:
        assert not flag.is_set()


def test_an_answer_without_a_session_cannot_be_stopped_and_leaves_nothing():
    stops = AnswerStops()
    with stops.answering(None) as flag:
        assert stops.running() == 0
        assert stops.stop(None) == 0
        assert not flag.is_set()


def test_an_answer_that_fails_still_leaves_nothing_behind():
    stops = AnswerStops()
    try:
        with stops.answering("alice"):
            raise RuntimeError("the backend failed")
    except RuntimeError:
        pass
    assert stops.running() == 0


def test_stops_from_other_threads_while_answers_start_and_end():
    """The Stop handler runs on another thread than the answers: many of both at once lose no flag and leave no
    entry."""
    stops = AnswerStops()
    seen: list[bool] = []
    started = threading.Barrier(9)

    def answer(i: int) -> None:
        with stops.answering(f"s{i % 4}") as flag:
            started.wait()
            started_stop.wait()
            seen.append(flag.is_set())

    started_stop = threading.Event()
    threads = [threading.Thread(target=answer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    assert sum(stops.stop(f"s{i}") for i in range(4)) == 8
    started_stop.set()
    for thread in threads:
        thread.join()
    assert seen == [True] * 8
    assert stops.running() == 0


def test_with_login_a_stop_reaches_only_its_own_users_answers():
    """The session id comes from the browser: with login on, a user who sends another's session id stops nothing
    (the teaching page keys its stops on user and session)."""
    import gradio as gr

    from medgemma_xray.web.teaching_page import _stop_key

    stops = AnswerStops()
    alice = gr.Request(username="alice", session_hash="s1")
    mallory = gr.Request(username="mallory", session_hash="s1")
    with stops.answering(_stop_key(alice)) as flag:
        assert stops.stop(_stop_key(mallory)) == 0
        assert not flag.is_set()
        assert stops.stop(_stop_key(alice)) == 1
    assert _stop_key(gr.Request()) is None, "a request without a session can stop nothing"
