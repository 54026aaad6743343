"""Models given loaded: what a run may and may not do with them.

    device, dtype = placement(target, drafter, device, dtype)   # plan(): how names are loaded
    check_free(target)                                          # plan(): not mid-stream elsewhere
    with decoding(target): ...                                  # stream(): the one loop on it

A loaded model keeps the device and dtype it was loaded with: a `device` or `dtype` it does not
hold is refused by name, never dropped (an fp16 request ran fp32); values no loading takes are
refused as load_target refuses them. A loaded target holds one decoding state (its KV cache, the
hidden states it captures): it serves one decoding loop at a time; a second loop started while a
stream over it is suspended (not exhausted, not closed) is refused, not left to corrupt both.

May import: loading (device and dtype checks), errors, torch; not planning or streaming.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ..errors import UsageError
from ..loading import DTYPES, check_device, resolve_dtype

_BUSY: "weakref.WeakSet[Any]" = weakref.WeakSet()  # targets a decoding loop holds now
_LOCK = threading.Lock()


def placement(target: Any, drafter: Any, device: Any, dtype: Any) -> tuple[str, str]:
    """The device and dtype to load the models given by name with: as given, else those of a
    model given loaded, else cpu and auto. Each given value is checked as load_target checks it,
    and refused where a model given loaded does not hold it."""
    if device is not None:
        check_device(device)
    if dtype is not None:
        resolve_dtype(dtype, "cpu")  # the name alone: 'auto' resolves per device below
    loaded = [(role, m) for role, m in (("target", target), ("drafter", drafter))
              if m is not None and not isinstance(m, str)]
    for role, model in loaded:
        _check_held(role, model, device, dtype)
    held = next((held_by(m)[0] for _, m in loaded if held_by(m)[0] is not None), None)
    return str(device or held or "cpu"), dtype or "auto"


def held_by(model: Any) -> tuple[torch.device | None, torch.dtype | None]:
    """(device, dtype) of a loaded model's weights; None where it does not tell (a graph's dtype)."""
    inner = getattr(model, "model", model)  # a target's Hugging Face model
    if isinstance(inner, torch.nn.Module):
        weight = next((t for t in inner.parameters() if t.is_floating_point()), None)
        if weight is not None:
            return weight.device, weight.dtype
    device = getattr(model, "device", None)
    return (device if isinstance(device, torch.device) else None), None


def _check_held(role: str, model: Any, device: Any, dtype: Any) -> None:
    name = str(getattr(model, "name", None) or getattr(model, "source", None) or type(model).__name__)
    on, kind = held_by(model)
    if device is not None and on is not None and not _same_device(torch.device(device), on):
        raise UsageError(f"`device` {device} does not apply to {role} '{name}', loaded already on {on}: drop "
                         f"`device`, or load the {role} on {device}")
    if dtype is None or dtype == "auto":
        return
    if kind is None:  # an exported graph: its dtype is the export's
        raise UsageError(f"`dtype` {dtype} does not apply to {role} '{name}', loaded already (in the dtype it was "
                         "exported or loaded in): drop `dtype`")
    if kind != DTYPES[dtype]:
        raise UsageError(f"`dtype` {dtype} does not apply to {role} '{name}', loaded already as {_dtype_name(kind)}: "
                         f"drop `dtype`, or load the {role} with `dtype` {dtype}")


def _same_device(asked: torch.device, held: torch.device) -> bool:
    """'cuda' names whichever GPU the model is on; 'cuda:1' only that one."""
    return asked.type == held.type and (asked.index is None or asked.index == (held.index or 0))


def _dtype_name(dtype: torch.dtype) -> str:
    return next((name for name, d in DTYPES.items() if d == dtype), str(dtype).removeprefix("torch."))


def check_free(target: Any) -> None:
    """Refuse a target that a suspended stream is decoding (its cache is that stream's)."""
    if target in _BUSY:
        name = getattr(target, "name", None) or type(target).__name__
        raise UsageError(f"target '{name}' is decoding a stream that has not finished: a loaded target decodes "
                         "one stream at a time; exhaust or close() that stream first, or load the target "
                         "again for a second one")


@contextmanager
def decoding(target: Any) -> Iterator[None]:
    """Hold the target for one decoding loop (refused while another holds it), released at its end."""
    with _LOCK:
        check_free(target)
        _BUSY.add(target)
    try:
        yield
    finally:
        _BUSY.discard(target)
