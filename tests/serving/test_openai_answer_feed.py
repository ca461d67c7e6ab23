"""The API's answer feed: one worker thread reads an answer and the event loop takes what gathered, so a stream
frames several tokens at once instead of one per token; a stop ends the answer at its next token and closes it on
the thread that ran it (which frees its decode slot); a failure reaches the loop as the answer's error."""

from __future__ import annotations

import asyncio
import threading

from medgemma_xray.web.openai.answer_feed import AnswerFeed


def cumulative(count: int):
    text = ""
    for number in range(count):
        text += f"t{number} "
        yield text


def test_tokens_that_gathered_while_the_loop_was_busy_come_as_one_frame():
    async def scenario():
        feed = AnswerFeed(cumulative(100), asyncio.get_running_loop())
        reader = threading.Thread(target=feed.read_all)
        reader.start()
        await asyncio.to_thread(reader.join)  # the loop takes nothing until the whole answer is there
        frames = [await feed.next()]
        return frames

    frames = asyncio.run(scenario())
    assert len(frames) == 1, "one wake-up for a hundred tokens"
    assert frames[0].finished and frames[0].error is None
    assert frames[0].text == "".join(f"t{number} " for number in range(100))


def test_stop_ends_the_answer_at_its_next_token_and_closes_it_on_its_own_thread():
    produced, release = threading.Event(), threading.Event()
    closed_on: list[str] = []

    def answer():
        try:
            yield "first"
            produced.set()
            release.wait(60)
            yield "first second"
            yield "first second third"  # never reached: the feed stops after "second"
        finally:
            closed_on.append(threading.current_thread().name)

    async def scenario():
        feed = AnswerFeed(answer(), asyncio.get_running_loop())
        reader = threading.Thread(target=feed.read_all, name="answer-reader")
        reader.start()
        await asyncio.to_thread(produced.wait, 60)
        first = await feed.next()
        feed.stop()
        release.set()
        await asyncio.to_thread(reader.join)
        return first, await feed.next()

    first, last = asyncio.run(scenario())
    assert first.text == "first" and not first.finished
    assert last.finished and last.text == "first second", "nothing was read after the stop"
    assert closed_on == ["answer-reader"]


def test_a_failure_reaches_the_loop_as_the_answers_error():
    def answer():
        yield "partial"
        raise TimeoutError("no progress")

    async def scenario():
        feed = AnswerFeed(answer(), asyncio.get_running_loop())
        reader = threading.Thread(target=feed.read_all)
        reader.start()
        await asyncio.to_thread(reader.join)
        return await feed.next()

    progress = asyncio.run(scenario())
    assert progress.finished and progress.text == "partial" and isinstance(progress.error, TimeoutError)
