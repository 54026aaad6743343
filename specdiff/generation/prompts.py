"""How prompts become ids and ids become text: the chat template (with a system message), stop
strings, and the checks of each prompt against the target's context window.

May import: requests, text, errors, contracts; not planning or streaming.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, cast

from ..contracts import Target
from ..errors import ContextWindowWarning, InputError, UsageError
from ..requests import check_text_options
from ..targets.block import BlockDiffusionTarget


@dataclass(frozen=True)
class TextOptions:
    """How prompts become ids and ids become text: the tokenizer's chat template (with an optional
    system message) and stop strings (text.StopStrings)."""

    chat: bool = False
    system: str | None = None
    stop: tuple[str, ...] = ()


def text_options(target: Target, chat: bool, system: str | None, stop: Iterable[str] | str | None) -> TextOptions:
    """Check and collect the chat / system / stop parameters for this target."""
    system, stop = check_text_options(system, stop)
    if system is not None and not chat:
        raise UsageError("a `system` message needs `chat` (the chat template places it)")
    if chat and not getattr(target.tokenizer, "chat_template", None):
        raise UsageError(f"{target.name}: its tokenizer has no chat template; drop `chat`")
    return TextOptions(bool(chat), system, tuple(stop))


def encode_prompts(target: Target | BlockDiffusionTarget, prompts: list[str], max_new_tokens: int,
                   truncate: bool = False, text: TextOptions = TextOptions(),
                   indices: list[int] | None = None) -> list[list[int]]:
    """Tokenize (through the chat template if `text.chat`) and check every prompt (empty, longer
    than the context window); warn once when `max_new_tokens` does not fit after some of them.
    Errors number prompts from 1, or by `indices` (0-based places in a larger input) + 1."""
    encoded = []
    for i, prompt in zip(indices or range(len(prompts)), prompts):
        i += 1
        ids = _encode(target.tokenizer, prompt, text) if prompt.strip() else []
        if not ids:
            raise InputError(f"prompt {i} is empty")
        if len(ids) >= target.max_length:
            if not truncate:
                raise InputError(
                    f"prompt {i} is {len(ids)} tokens; the target's context window is "
                    f"{target.max_length} (use `truncate_prompt` to keep only its end)")
            ids = ids[-max(1, target.max_length - max_new_tokens):]
        encoded.append(ids)
    _warn_past_context(encoded, max_new_tokens, target.max_length)
    return encoded


def _encode(tokenizer: Any, prompt: str, text: TextOptions) -> list[int]:
    if not text.chat:
        return cast(list[int], tokenizer.encode(prompt))
    messages = ([{"role": "system", "content": text.system}] if text.system is not None else [])
    messages.append({"role": "user", "content": prompt})
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def _warn_past_context(encoded: list[list[int]], max_new_tokens: int, max_length: int) -> None:
    over = sum(len(ids) + max_new_tokens > max_length for ids in encoded)
    if over:
        warnings.warn(ContextWindowWarning(
            f"`max_new_tokens` {max_new_tokens} does not fit in the target's context window "
            f"({max_length} tokens) after {over} of {len(encoded)} prompt(s): they stop at the "
            "window (stop reason 'context')"), stacklevel=2)
