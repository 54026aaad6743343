"""Per-call accounting by forward hooks, so that any decoding loop (specdiff's own, or Hugging Face
`generate`) can be measured the same way without touching it.

CallLog hooks the top-level modules it is given (the target's causal LM, a drafter) and records,
for every forward call: tokens fed, tokens already in the KV cache, and seconds (with a device
sync on CUDA). A call on an empty cache is a prefill. A module whose calls are other methods
than forward (an EAGLE-3 head's extend / step / logits: its kind's `calls`) has those methods
timed instead, through wrappers on the instance that close() removes (no KV cache is read there).

From the target's calls alone the acceptance of every verification follows, for any loop that
keeps the cache invariant "the cache holds every committed token but the last" between calls
(specdiff's loop and HF assisted / prompt-lookup decoding both do). With S_i the committed
sequence length before call i and L_i its cache length:
    drafted_i  = fed_i - (S_i - L_i)        the uncommitted tokens fed are draft tokens
    accepted_i = S_{i+1} - S_i - 1          S_{i+1} = L_{i+1} + 1, or prompt + new tokens at the end
A call with no draft tokens on an empty cache is a pure prefill, not a verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from ..hf_cache import passed_cache


@dataclass(frozen=True)
class Call:
    fed: int  # tokens in input_ids
    cached: int | None  # tokens in the KV cache before the call; None: the model keeps no cache
    seconds: float

    @property
    def prefill(self) -> bool:
        return self.cached == 0


class CallLog:
    """Records every forward call of `modules` (role -> module) until closed; a context manager."""

    def __init__(self, modules: dict[str, nn.Module], device: torch.device | str = "cpu",
                 methods: dict[str, tuple[str, ...]] | None = None):
        """methods: role -> the names of the methods whose calls are that role's calls (default
        forward, hooked)."""
        self.calls: dict[str, list[Call]] = {role: [] for role in modules}
        self._sync = torch.device(device).type == "cuda"
        self._open: dict[str, tuple[int, int | None, float]] = {}
        self._handles: list[Any] = []  # hooks' handles and the wrapped methods' removers
        for role, module in modules.items():
            for name in (methods or {}).get(role, ("forward",)):
                if name == "forward":
                    self._handles.append(module.register_forward_pre_hook(partial(self._pre, role), with_kwargs=True))
                    self._handles.append(module.register_forward_hook(partial(self._post, role), with_kwargs=True))
                else:
                    self._handles.append(self._wrap(role, module, name))

    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre(self, role: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = cast(torch.Tensor, kwargs.get("input_ids", args[0] if args else None))  # (B, S): always given
        fed = int(ids.shape[1]) if ids.dim() == 2 else 1  # (B,): a DFlash drafter's anchors, its block built inside
        cache = passed_cache(kwargs)
        cached = None if cache is None else int(cache.get_seq_length())
        self._open[role] = (fed, cached, self._now())

    def _post(self, role: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: object) -> None:
        fed, cached, start = self._open.pop(role)
        self.calls[role].append(Call(fed, cached, self._now() - start))

    def _wrap(self, role: str, module: nn.Module, name: str) -> Any:
        """Time `module.name` as `role`'s calls (tokens fed: its first argument's second dimension)
        by an instance attribute over the class's method; -> what removes it (`.remove()`)."""
        method = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self._now()
            out = method(*args, **kwargs)
            first = args[0] if args else None
            fed = int(first.shape[1]) if isinstance(first, torch.Tensor) and first.dim() > 1 else 1
            self.calls[role].append(Call(fed, None, self._now() - start))
            return out

        object.__setattr__(module, name, timed)  # not nn.Module's: a plain attribute, no submodule
        return SimpleNamespace(remove=partial(object.__delattr__, module, name))

    def take(self) -> dict[str, list[Call]]:
        """The calls recorded since the last take(), by role; the log starts afresh."""
        taken = self.calls
        self.calls = {role: [] for role in taken}
        return taken

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> "CallLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verifications(target_calls: list[Call], n_prompt: int, n_new: int) -> list[tuple[int, int]]:
    """(drafted, accepted) for each verification call of one prompt (see the module docstring)."""
    out, committed = [], n_prompt
    for i, call in enumerate(target_calls):
        after = (target_calls[i + 1].cached or 0) + 1 if i + 1 < len(target_calls) else n_prompt + n_new
        drafted = call.fed - (committed - (call.cached or 0))
        if not (call.prefill and drafted == 0):
            out.append((drafted, min(max(after - committed - 1, 0), drafted)))
        committed = after
    return out


def mean_seconds(calls: list[Call], prefill: bool = False) -> float | None:
    """Mean seconds of the prefill calls (prefill=True) or of the others; None if there are none."""
    times = [c.seconds for c in calls if c.prefill == prefill]
    return sum(times) / len(times) if times else None
