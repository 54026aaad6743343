"""--threads for `generate` and `bench`: how many threads torch's CPU kernels use.

The default leaves one usable CPU free. torch's threads meet at a barrier in every operation, so
when another process takes one of the cores a run with one thread per core waits for the
descheduled thread at each op: on a shared 2-vCPU machine the demo pair's `ar` ran at a median
13 tokens/s [3.4, 129] over 8 rounds with 2 threads, 98 [60, 130] with 1 (docs/bench.md).
On a larger machine the cost of the spare core is small.
"""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

import click

from specdiff.requests import MAX_THREADS

F = TypeVar("F", bound=Callable[..., Any])


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_threads() -> int:
    """The usable CPUs less one, at least one."""
    return max(1, usable_cpus() - 1)


def threads_option(command: F) -> F:
    """The --threads option, added to a click command function."""
    return click.option(
        "--threads", type=click.IntRange(min=1, max=MAX_THREADS),  # 10**20 overflowed inside torch
        help=f"torch CPU threads [default: the usable CPUs less one, here {default_threads()}; "
             "one per core is slower and erratic when other processes share the cores].")(command)


def set_threads(threads: int | None) -> int:
    """Set torch's thread count for this process (None: the default); -> the count set."""
    import torch

    threads = threads or default_threads()
    torch.set_num_threads(threads)
    return threads
