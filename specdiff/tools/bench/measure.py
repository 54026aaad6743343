"""Timing: warm-up passes, then timed passes round-robin, every forward call logged where it can
be (callstats); the process's memory and the machine it ran on.
May import: bench.config, bench.passes, tools.callstats and the library.
"""

from __future__ import annotations

import platform
import resource
from dataclasses import dataclass, field
from typing import Callable

import torch
import transformers

from ...metrics import Metrics
from ...targets.block import BlockDiffusionTarget
from ..callstats import CallLog
from .config import Models, Settings, Variant
from .passes import PASSES, Pass

@dataclass
class Repeat:
    """One timed pass over the prompts."""

    tokens: list[list[int]]  # per prompt
    seconds: list[float]
    calls: list[dict]  # per prompt: role -> [Call] (batched: the calls made until it was done)
    metrics: list[Metrics | None] = field(default_factory=list)  # per prompt, the loop's own (peers: None)
    cuda_peak_mb: float | None = None  # peak CUDA memory allocated during this pass
    kv_peak_mb: float | None = None  # largest KV cache the target held during this pass

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / sum(self.seconds)

    def role_calls(self, role: str) -> list:
        return [c for prompt in self.calls for c in prompt.get(role, [])]


def _timed_pass(models: Models, v: Variant, one_pass: Pass, prompts: list[str],
                encoded: list[list[int]]) -> Repeat:
    """One pass with every forward call logged where calls can be (Variant.logged; elsewhere the
    loop's own metrics count them)."""
    roles = {"target": models.target.model} if v.logged else {}
    if models.drafter_module(v.method) is not None and v.logged:
        roles["drafter"] = models.drafter_module(v.method)
    device, r = models.target.device, Repeat([], [], [])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    target = one_pass.plan.target if one_pass.plan else models.target
    assert not isinstance(target, BlockDiffusionTarget)  # timed by bench_block
    target.kv_peak_bytes = 0
    with CallLog(roles, device) as log:
        for tokens, seconds, metrics in one_pass(prompts, encoded):
            r.tokens.append(tokens)
            r.seconds.append(seconds)
            r.metrics.append(metrics)
            r.calls.append(log.take())  # this prompt's calls
    if device.type == "cuda":
        r.cuda_peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    r.kv_peak_mb = target.kv_peak_bytes / 2**20
    return r


def time_variants(models: Models, rows: list[Variant], s: Settings, prompts: list[str], encoded: list[list[int]],
             log: Callable[[str], None]) -> tuple[list[list[Repeat]], list[float | None]]:
    """Warm-up passes of every variant, then the timed passes round-robin (pass i of every variant,
    then pass i + 1), so that a slow spell of a shared machine hits all methods alike instead of
    all the passes of one. -> per variant, its timed passes and its compile seconds (compiled
    rows: spent before their first pass decoded, in no pass's time)."""
    passes = [PASSES[v.method](models, v, s) for v in rows]
    for v, one_pass in zip(rows, passes):
        log(f"bench: warm-up {v.label}")
        one_pass.prime(len(prompts))
        for _ in range(s.warmup):
            for _ in one_pass(prompts, encoded):
                pass
    repeats: list[list[Repeat]] = [[] for _ in rows]
    for i in range(s.repeats):
        log(f"bench: timed pass {i + 1}/{s.repeats} of {len(rows)} variants")
        for v, one_pass, out in zip(rows, passes, repeats):
            out.append(_timed_pass(models, v, one_pass, prompts, encoded))
    return repeats, [one_pass.compile_s for one_pass in passes]


def memory_of(repeats: list[Repeat]) -> dict:
    """The process's RSS high-water mark (all variants so far), this variant's CUDA peak and the
    largest KV cache its passes held (HF peers keep their own cache: None)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cuda = [r.cuda_peak_mb for r in repeats if r.cuda_peak_mb is not None]
    kv = max(r.kv_peak_mb or 0.0 for r in repeats)
    return {"peak_rss_mb": rss, "cuda_peak_mb": max(cuda) if cuda else None, "kv_cache_peak_mb": kv or None}


def environment(models: Models) -> dict:
    device = models.target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {"device": str(device), "device_name": name, "dtype": str(models.target.model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()
