"""Token ids -> text: piece by piece for streaming (IncrementalText), and stop strings
(StopStrings).

IncrementalText returns only the text that is final so far. Text that may still change is held
back: a trailing U+FFFD (a character whose bytes are split across tokens) or a decode that no
longer extends what was already returned.
"""

from __future__ import annotations

from typing import Any


class StopStrings:
    """Stop strings as vLLM and the OpenAI API treat them: decoding stops after the first token
    whose text completes one of them, and the returned text ends just before it.

    Called with a row's new tokens after every token it appends (decoding.Row), so every method
    stops at the very token plain decoding stops at. Only the text of the last tokens is decoded
    (enough for the longest string: a token decodes to at least one character, or to part of
    one, whose bytes 4 tokens at most cover).
    """

    def __init__(self, tokenizer: Any, strings: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.strings = strings
        self.window = 4 * max(map(len, strings)) + 4

    def __call__(self, new_tokens: list[int]) -> bool:
        tail = self.tokenizer.decode(new_tokens[-self.window:], skip_special_tokens=True)
        return any(s in tail for s in self.strings)

    def cut(self, text: str) -> str:
        return cut(text, self.strings)


def cut(text: str, stop: tuple[str, ...]) -> str:
    """text up to the earliest of the stop strings in it (all of it if none)."""
    ends = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(ends)] if ends else text


class IncrementalText:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        """Add ids; -> the new final text (possibly empty)."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""
        text = cut(text, self.stop)  # a stop string completed: the continuation ends before it
        return self._emit(text[:len(text) - self._held(text)])

    def finish(self, text: str) -> str:
        """The rest of the finished continuation `text` (what was held back)."""
        return self._emit(text) if text.startswith(self.emitted) else ""

    def _held(self, text: str) -> int:
        """Length of the longest end of text that may begin a stop string (it may yet be cut)."""
        return max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)

    def _emit(self, text: str) -> str:
        piece, self.emitted = text[len(self.emitted):], max(text, self.emitted, key=len)
        return piece
