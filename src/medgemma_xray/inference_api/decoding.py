"""Token ids to text as they arrive, without splitting a character or losing a tokenizer's spacing rules."""

from __future__ import annotations

from collections.abc import Callable


class IncrementalDecoder:
    """Text deltas for a growing list of token ids; their concatenation equals decoding all ids at once.

    The windowed rule of text-generation-inference: decode a short window behind the newest token and emit only
    what it adds, holding back while the text ends in an incomplete character (U+FFFD). Each push decodes a few
    tokens, not the whole answer.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(self._ids[self._prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """What is still held back (an incomplete character at the very end, decoded as the tokenizer does)."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix) :] if text.startswith(prefix) else ""
