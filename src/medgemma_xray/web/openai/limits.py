"""The server's limits applied to the whole conversation an API client sends, before any work.

A client sends the whole history with every request, and every turn of it is prefilled: so every user and
assistant turn and the system text are checked, not only the last question. The whole conversation's UTF-8 bytes
are bounded at MAX_BYTES_PER_TOKEN times the sequence the server holds: no real text needs more bytes per token,
so a longer conversation cannot fit, and it is refused before its film is even decoded.
"""

from __future__ import annotations

from medgemma_xray.web.openai.errors import bad_request

MAX_BYTES_PER_TOKEN = 8


class ConversationLimits:
    def __init__(self, limits, max_sequence: int) -> None:
        self.limits, self.max_sequence = limits, max_sequence

    def check(self, conversation) -> None:
        from medgemma_xray.inference_api.errors import RequestError

        texts = [conversation.system_prompt or ""] + [turn.text for turn in conversation.turns]
        questions = [turn.text for turn in conversation.turns if turn.role == "user"]
        try:
            for text in texts:
                self.limits.check_markers(text)
            self.limits.check_question(len(questions) - 1, questions[-1])
            for earlier in questions[:-1]:
                self.limits.check_question(0, earlier)
        except RequestError as exc:
            raise bad_request(str(exc), param="messages", code="limit_exceeded") from None
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
        if size > MAX_BYTES_PER_TOKEN * self.max_sequence:
            raise bad_request(
                f"The conversation is too long: {size} bytes of text cannot fit the {self.max_sequence} tokens this "
                "server holds (MAX_SEQUENCE). Start a new conversation with the film and the question.",
                param="messages",
                code="limit_exceeded",
            )
