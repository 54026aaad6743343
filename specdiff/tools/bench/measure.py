"""Timing: warm-up passes, then timed passes round-robin, every forward call logged where it can
be (callstats); the process's memory, the machine it ran on and how busy other processes kept it
(CpuLoad).
May import: bench.config, bench.passes, tools.callstats and the library.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import transformers

from ...kinds import kind_of
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
    calls: list[dict[str, Any]]  # per prompt: role -> [Call] (batched: the calls made until it was done)
    metrics: list[Metrics | None] = field(default_factory=list)  # per prompt, the loop's own (peers: None)
    cuda_peak_mb: float | None = None  # peak CUDA memory allocated during this pass
    kv_peak_mb: float | None = None  # largest KV cache the target held during this pass

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / sum(self.seconds)

    def role_calls(self, role: str) -> list[Any]:
        return [c for prompt in self.calls for c in prompt.get(role, [])]


def _timed_pass(models: Models, v: Variant, one_pass: Pass, prompts: list[str],
                encoded: list[list[int]]) -> Repeat:
    """One pass with every forward call logged where calls can be (Variant.logged; elsewhere the
    loop's own metrics count them)."""
    roles = {"target": models.target.model} if v.logged else {}
    methods: dict[str, tuple[str, ...]] = {}  # the drafter's calls: its kind's (an EAGLE-3 head's are no forward)
    drafter = models.drafter_module(v.method) if v.logged else None
    if drafter is not None:
        roles["drafter"] = drafter
        kind = kind_of(models.drafter_for(v.method))
        if kind:  # else CallLog's default, forward
            methods["drafter"] = kind.calls
    device, r = models.target.device, Repeat([], [], [])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    target = one_pass.plan.target if one_pass.plan else models.target
    assert not isinstance(target, BlockDiffusionTarget)  # timed by bench_block
    target.kv_peak_bytes = 0
    with CallLog(roles, device, methods) as log:
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
        if s.warmup:
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


def memory_of(repeats: list[Repeat]) -> dict[str, Any]:
    """The process's RSS high-water mark (all variants so far), this variant's CUDA peak and the
    largest KV cache its passes held (HF peers keep their own cache: None)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cuda = [r.cuda_peak_mb for r in repeats if r.cuda_peak_mb is not None]
    kv = max(r.kv_peak_mb or 0.0 for r in repeats)
    return {"peak_rss_mb": rss, "cuda_peak_mb": max(cuda) if cuda else None, "kv_cache_peak_mb": kv or None}


def environment(models: Models, load: CpuLoad | None = None) -> dict[str, Any]:
    """The machine and software a run had; `foreign_cpu_load`: the cores other processes kept busy
    during it (`load`; "unknown" where that cannot be read)."""
    device = models.target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {"device": str(device), "device_name": name, "dtype": str(models.target.model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "foreign_cpu_load": "unknown" if load is None or load.cores is None else load.cores}


class CpuLoad:
    """How many CPU cores other processes kept busy while it was open (`cores`): the machine's
    busy time (/proc/stat; else psutil, if installed) less this process's own CPU time, over the
    wall time. None: no way to read the machine's busy time here (bench.json: "unknown")."""

    def __enter__(self) -> CpuLoad:
        self.cores: float | None = None
        self._start = (time.perf_counter(), _own_cpu_s(), _busy_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, own, busy = time.perf_counter(), _own_cpu_s(), _busy_s()
        if busy is not None and self._start[2] is not None and wall > self._start[0]:
            foreign = (busy - self._start[2]) - (own - self._start[1])
            self.cores = round(max(foreign, 0.0) / (wall - self._start[0]), 3)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _busy_s() -> float | None:
    """Seconds of CPU time the whole machine has spent busy (all cores) since boot; None: unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
        ticks = [int(x) for x in fields[1:9]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # optional, not a dependency
    except ImportError:
        return None
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()
