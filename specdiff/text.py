"""Token ids -> text, piece by piece, for streaming: each call returns only the text that is
final so far. Text that may still change is held back: a trailing U+FFFD (a character whose
bytes are split across tokens) or a decode that no longer extends what was already returned."""

from __future__ import annotations

from typing import Any


class IncrementalText:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        """Add ids; -> the new final text (possibly empty)."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""
        return self._emit(text)

    def finish(self, text: str) -> str:
        """The rest of the finished continuation `text` (what was held back)."""
        return self._emit(text) if text.startswith(self.emitted) else ""

    def _emit(self, text: str) -> str:
        piece, self.emitted = text[len(self.emitted):], text
        return piece
