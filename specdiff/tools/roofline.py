"""The hardware's floor for a target step, measured by the run that reports against it (bench's
roofline columns; ../shared/reference/cpu-floor.md has the figures of this project's CPU).

A decode(1) or verify(w) call of a dense decoder reads its weights once and does about 2 x N x w
flops (N: the parameters it multiplies with), so no runtime can take less than

    floor(w) = max(weight_bytes / read_bandwidth, 2 N w / peak_flops)

weight_bytes: every parameter but the input embedding's (a lookup reads w rows of it), the head
counted once (tied: the embedding is the head), at the runtime's element size. Peaks are measured
on the device and threads the run uses: read bandwidth as the sum of a 512 MiB tensor, peak flops
as an n^3 matrix product, best of `repeats` each.
May import: torch and the library's model contracts only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

READ_MIB = 512
MATMUL_N = 1024


@dataclass(frozen=True)
class Peaks:
    """A device's measured read bandwidth (GB/s) and matmul rate (GFLOP/s)."""

    read_gb_s: float
    gflop_s: float
    device: str

    def floor_s(self, weights: WeightCost, width: int) -> float:
        """The least seconds a call of `width` tokens can take (see the module docstring)."""
        return max(weights.bytes / (self.read_gb_s * 1e9), 2 * weights.params * width / (self.gflop_s * 1e9))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WeightCost:
    """What one target step multiplies with: `params` parameters, `bytes` of them read."""

    params: int
    bytes: int


def weight_cost(model: torch.nn.Module, element_bytes: int | None = None) -> WeightCost:
    """A Hugging Face causal LM's step cost (module docstring); element_bytes: the runtime's (default:
    the model's own)."""
    embedding = model.get_input_embeddings().weight  # type: ignore[operator]
    head = model.get_output_embeddings()  # type: ignore[operator]
    tied = head is not None and head.weight.data_ptr() == embedding.data_ptr()
    unique = {p.data_ptr(): p for p in model.parameters()}
    kept = [p for ptr, p in unique.items() if tied or ptr != embedding.data_ptr()]
    params = sum(p.numel() for p in kept)
    size = element_bytes or kept[0].element_size()
    return WeightCost(params, params * size)


def measure_peaks(device: str = "cpu", repeats: int = 3) -> Peaks:
    """Read bandwidth and matmul rate of `device` with the current torch threads."""
    dev = torch.device(device)
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = torch.ones(READ_MIB * 2**20 // 4, dtype=torch.float32, device=dev)
    read = _best(lambda: x.sum(), sync, repeats)
    del x
    a = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev)
    mm = _best(lambda: a @ b, sync, repeats)
    return Peaks(round(READ_MIB * 2**20 / read / 1e9, 2), round(2 * MATMUL_N**3 / mm / 1e9, 1), str(dev))


def _best(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    """The least seconds of `repeats` calls after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)
