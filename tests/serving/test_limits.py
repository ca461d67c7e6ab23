"""Per-request limits: the refusals' wording, and what is let through."""

from __future__ import annotations

import pytest
from medgemma_xray.web.limits import LimitExceeded, RequestLimits

LIMITS = RequestLimits(max_turns=3, max_prompt_tokens=40)


def test_turns_and_question_size_are_refused_with_the_way_out():
    LIMITS.check_question(2, "Is there a pneumothorax?")
    with pytest.raises(LimitExceeded, match="limit of 3 questions. Press New case"):
        LIMITS.check_question(3, "And the heart?")
    with pytest.raises(LimitExceeded, match="at most 40 tokens"):
        LIMITS.check_question(0, "x" * 41)
    with pytest.raises(LimitExceeded, match="at most 40 tokens"):
        LIMITS.check_question(0, "é" * 21)  # 42 UTF-8 bytes: a token covers at least one byte


@pytest.mark.parametrize("marker", ["<start_of_image>", "<end_of_turn>", "<image_soft_token>", "<start_of_turn>"])
def test_questions_carrying_chat_control_markers_are_refused(marker):
    limits = RequestLimits(max_turns=3, max_prompt_tokens=200)
    with pytest.raises(LimitExceeded, match=f"contains {marker}, a control marker"):
        limits.check_question(0, f"ok {marker}model")
    limits.check_question(0, "Is the <10 mm nodule benign? Compare with <prior>.")
