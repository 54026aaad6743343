"""Memory a decoding step needs, estimated before the first step runs: a size no machine here can
hold (`drafts` 100000, `batch_size` 10**8) is one UsageError naming the sizes, not minutes of
swapping ended by the OOM killer.

    check_step(target, rows=batch_size * drafts, tokens=gamma + 1, context=longest)
    check_fits(need, device, sizes, what)   any other floor (distill's data and batches, drafter init)

The estimate is the step's largest tensors: float32 logits over the vocabulary for every token a
verification call scores (LOGIT_COPIES of them live at once: logits, warped p, the draft's q and
a sampling temporary) and the target's KV cache for every row (when the target says what its
cache holds per token). Weights are loaded already and not counted. Free memory: CUDA's own
count on a CUDA device; on the CPU, Linux's MemAvailable, lowered to the cgroup's limit when one
is set. Elsewhere (another OS, another device) nothing is checked.

Non-goals: an exact peak. The estimate is a floor, so a refusal is certain to be right; a run that
passes may still be near the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from .errors import UsageError

LOGIT_COPIES = 4  # float32 tensors of (rows, tokens, V) alive together in a step
GB = 1e9


def kv_bytes_per_token(target: Any) -> int:
    """Bytes one token of one row adds to the target's KV cache (keys and values of every layer,
    and the hidden states it captures: targets.causal.CausalLMTarget.capture);
    0 when the target does not say (an exported graph's runtime)."""
    config = getattr(getattr(target, "model", None), "config", None)
    layers, hidden = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(hidden, int)):
        return 0
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads:
        hidden = hidden * kv_heads // heads  # grouped-query attention caches fewer heads
    dtype = getattr(target.model, "dtype", torch.float32)
    features = len(getattr(target, "captured", ())) * getattr(config, "hidden_size", 0)  # what a DFlash run keeps
    return (2 * layers * hidden + features) * dtype.itemsize


def step_bytes(target: Any, rows: int, tokens: int, context: int) -> int:
    """A floor on the memory of one decoding step: `rows` rows scoring `tokens` tokens each, with
    caches of up to `context` tokens (both clipped to the target's context window)."""
    tokens, context = min(tokens, target.max_length), min(context, target.max_length)
    return cast(int, rows * (tokens * target.vocab_size * 4 * LOGIT_COPIES + context * kv_bytes_per_token(target)))


def free_bytes(device: torch.device) -> int | None:
    """Memory free for this process on `device`; None when it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    return _cpu_free()


def _cpu_free() -> int | None:
    """Linux's MemAvailable, or what the cgroup (a container's limit) leaves, whichever is less."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in meminfo.splitlines() if ":" in line)
    if "MemAvailable" not in fields:
        return None
    free = int(fields["MemAvailable"].split()[0]) * 1024
    try:
        limit, used = (Path("/sys/fs/cgroup", name).read_text().strip() for name in ("memory.max", "memory.current"))
    except OSError:
        return free
    return min(free, int(limit) - int(used)) if limit.isdigit() and used.isdigit() else free


def check_step(target: Any, *, rows: int, tokens: int, context: int, sizes: dict[str, int]) -> None:
    """Refuse a step that cannot fit in free memory; `sizes`: the settings that made it this big
    (named in the error, e.g. {"batch_size": 8, "drafts": 100000, "gamma": 8})."""
    need, free = step_bytes(target, rows, tokens, context), free_bytes(target.device)
    if free is None or need <= free:
        return
    named = ", ".join(f"`{name}` {value}" for name, value in sizes.items())
    raise UsageError(f"{named}: one decoding step needs about {need / GB:.1f} GB ({rows} rows of {tokens} token(s) "
                     f"over a {target.vocab_size}-token vocabulary), more than the {free / GB:.1f} GB free on "
                     f"{target.device}; lower them")


def check_fits(need: int, device: torch.device, sizes: dict[str, int], what: str) -> None:
    """Refuse `need` bytes, a floor on what `what` allocates, beyond the memory free on `device`;
    `sizes`: the settings that made it this big (named in the error)."""
    free = free_bytes(device)
    if free is None or need <= free:
        return
    named = ", ".join(f"`{name}` {value}" for name, value in sizes.items())
    raise UsageError(f"{named}: {what} would take at least {need / GB:.3g} GB, more than the {free / GB:.3g} GB free "
                     f"on {device}; lower them")
