"""Scale-out on Ray Data: the same `generate` over a cluster, output unchanged.

    import specdiff.ray
    result = specdiff.ray.generate(prompts, workers=4, gpus_per_worker=1, target="gpt2-xl",
                                   drafter="mdlm-owt", device="cuda")
    result.texts, result.metrics, result.ray          # in input order; Ray's own timings

    ds = ray.data.read_json("in.jsonl")               # or any Dataset with a "prompt" column
    specdiff.ray.map_prompts(ds, workers=4).write_json("out/")   # lazily, nothing on the driver

Prompts become rows {index, prompt}. An actor pool (`map_batches` with the callable class
`Worker`, `ActorPoolStrategy(size=workers)`) loads target and drafter once per worker and runs
the ordinary decoding loop over each batch of rows. Each prompt's generator is seeded from `seed`
and its index in the whole input (generation.stream's `indices`), so how prompts are sharded
cannot change any output. Options are those of `specdiff.generate`, with models named (names,
paths, hub ids), since each worker loads its own.

Failures: Ray Data restarts a worker whose process dies and retries its batch (its actors'
default `max_restarts=-1`, `max_task_retries=-1`); the user sees a Ray warning on stderr and the
same output. A SpecdiffError raised in a worker (an over-long prompt, an unknown model) is not
retried: the run fails with that error, after the results already written (a -o file is never
left partial). Ray is an optional extra (`specdiff[ray]`), imported on first use.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import SpecdiffError, UsageError
from .extras import require
from .generation import GenerationResult, plan
from .requests import check_flags, check_keywords, check_prompts, check_request, check_threads
from .settings import OPTIONS

PLAN_PARAMETERS = tuple(name for name in inspect.signature(plan).parameters if name != "options")
TASK_SIZE = 32  # prompts per map_batches call: a worker's unit of work and of retry, refilling
# its decoding batch (`batch_size`, an option of generate) as rows finish


@dataclass
class RayResult(GenerationResult):
    """A GenerationResult (outputs in input order, `.texts`, `.metrics`) plus Ray's overhead:
    `ray` = {"init_s", "wall_s" (the pool's run), "workers", "batches", "batch_s" (each batch's
    seconds inside its worker, model loading excluded), "decode_s"}; `settings`: {"method",
    "settings"} of the plan the workers ran, as --stats prints them."""

    ray: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def init(address: str | None = None, **ray_init: Any) -> float:
    """Connect to Ray (once per process): "local" starts a local instance; an address (or None with
    RAY_ADDRESS set) joins a cluster; None without RAY_ADDRESS starts a local one. -> seconds.

    An address where nothing answers is refused within PROBE_S seconds (Ray itself retries for
    minutes). The process keeps its own signal handlers (ray.init replaces SIGTERM's, and its core
    worker installs one that dumps a C++ stack and aborts: exit 134; see _signal_handlers_kept), and what Ray's driver prints
    of its cluster (a worker that died, the workers' own output) goes to stderr, not stdout."""
    if address is not None and not isinstance(address, str):
        raise UsageError(f"`address` must be 'local', a Ray address (host:port, ray://host:port) or None, "
                         f"got {type(address).__name__}")
    ray = require("ray", "ray")
    start = time.perf_counter()
    _ray_prints_to_stderr()
    if not ray.is_initialized():
        address = None if address == "local" else address or os.environ.get("RAY_ADDRESS")
        if address:
            _probe(address)
        try:
            with _signal_handlers_kept():
                ray.init(address=address, **ray_init)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UsageError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}") from e
        STARTED["local"] = not address
    return time.perf_counter() - start


STARTED = {"local": False}  # whether init started a local Ray: its nodes are all it will ever have


def _check_fits(cpus: float, gpus: float) -> None:
    """A worker that no node of a local Ray can hold waited forever (Ray's autoscaler, which has no
    node to add, said so every 35 s). A cluster may grow: it is left to Ray."""
    if not STARTED["local"]:
        return
    have = require("ray", "ray").cluster_resources()
    cpu, gpu = have.get("CPU", 0), have.get("GPU", 0)
    if cpus > cpu or gpus > gpu:
        raise UsageError(f"a worker reserves {cpus:g} CPU(s) and {gpus:g} GPU(s) (`cpus_per_worker`, "
                         f"`gpus_per_worker`); the local Ray has {cpu:g} and {gpu:g}, and no more will come")


PROBE_S = 5.0  # seconds to wait for a cluster's address to accept a connection


def _probe(address: str) -> None:
    """Refuse a cluster address ("host:port", "ray://host:port") where nothing accepts a TCP
    connection within PROBE_S; other forms ("auto") are left to Ray, which answers them at once."""
    host, colon, port = address.split("://", 1)[-1].rpartition(":")
    if not (colon and host and port.isdigit()):
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except TimeoutError as e:
        raise UsageError(f"cannot reach the Ray cluster at {address}: no answer within {PROBE_S:g} s") from e
    except (OSError, OverflowError, ValueError) as e:  # refused, unknown host, port > 65535
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UsageError(f"cannot reach the Ray cluster at {address}: {reason}") from e


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Put back the process's own handlers of the stop signals after the block (ray.init): where
    it had none (the default action), Ray's Python handler stays, which shuts Ray down and exits.
    Setting a handler again also replaces, at the C level, the one Ray's core worker installs for
    SIGTERM (it dumps a C++ stack and aborts). Main thread only: elsewhere none can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in kept.items():
            handler = signal.getsignal(s) if handler == signal.SIG_DFL else handler
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(s, handler)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _ray_prints_to_stderr() -> None:
    """Ray's driver prints its cluster's messages ("A worker died...", the workers' own stdout)
    on sys.stdout, where they would be mixed into the results: send them to stderr. Ray has no
    setting for it; its printing function (ray._private.worker.print_to_stdstream, looked up on
    each message) is wrapped, where this version of Ray has it."""
    try:
        from ray._private import worker
    except ImportError:
        return
    show = getattr(worker, "print_to_stdstream", None)
    if show is None or getattr(show, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return show({**data, "is_err": True}, *args, **kwargs)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


class Worker:
    """One actor of the pool: loads the models once, then decodes batches of rows
    {"index": (n,) int, "prompt": (n,) str}, adding to each row "output" (a pickled
    generation.Output), "error" (a pickled SpecdiffError that stopped the batch, else None),
    "batch" (the batch's first index), "batch_s" (its seconds) and "settings" (the plan's, JSON).
    A SpecdiffError travels as data: it is the user's to fix, so Ray must not retry it."""

    def __init__(self, options: dict[str, Any], threads: int | None = None,
                 truncate_prompt: bool = False):
        import torch

        from .generation import plan

        if threads:
            torch.set_num_threads(threads)
        self.truncate_prompt = truncate_prompt
        self.error: SpecdiffError | None = None
        try:
            self.plan = plan(**options)
        except SpecdiffError as e:
            self.error = e

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        start, indices = time.perf_counter(), [int(i) for i in batch["index"]]
        outputs, error = self._decode([str(p) for p in batch["prompt"]], indices)
        n, seconds = len(indices), time.perf_counter() - start
        settings = None if self.error else json.dumps({"method": self.plan.method.name,
                                                       "settings": self.plan.settings()})
        return {**batch, "output": [pickle.dumps(o) for o in outputs] + [None] * (n - len(outputs)),
                "error": [error] * n, "batch": [indices[0]] * n, "batch_s": [seconds] * n,
                "settings": [settings] * n}

    def _decode(self, prompts: list[str], indices: list[int]) -> tuple[list[Any], bytes | None]:
        from .generation import iter_generate

        outputs: list[Any] = []
        try:
            if self.error:
                raise self.error
            outputs.extend(iter_generate(prompts, self.plan, self.truncate_prompt, indices=indices))
        except SpecdiffError as e:
            return outputs, pickle.dumps(e)
        return outputs, None


def map_prompts(ds: Any, *, workers: int = 2, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0,
                task_size: int = TASK_SIZE, threads: int | None = None, truncate_prompt: bool = False,
                **options: Any) -> Any:
    """A Ray Dataset with a "prompt" column (and "index", the prompt's place in the whole input;
    added in dataset order when absent) -> the lazy Dataset of its rows with the columns Worker
    adds. `options`: as for specdiff.generate (models by name), checked here before any worker
    starts."""
    _check_options(options)
    _check_pool(workers, cpus_per_worker, gpus_per_worker, task_size, threads, truncate_prompt)
    _check_fits(cpus_per_worker, gpus_per_worker)
    ray = require("ray", "ray")
    if "index" not in ds.columns():
        ds = ds.zip(ray.data.range(ds.count()).rename_columns({"id": "index"}))
    return ds.map_batches(Worker, fn_constructor_kwargs={"options": options, "threads": threads,
                                                         "truncate_prompt": truncate_prompt},
                          compute=ray.data.ActorPoolStrategy(size=workers), batch_size=task_size,
                          num_cpus=cpus_per_worker, num_gpus=gpus_per_worker or None)


def generate(prompts: str | list[str], *, address: str | None = None, ray_init: dict[str, Any] | None = None,
             workers: int = 2, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0,
             task_size: int = TASK_SIZE, threads: int | None = None, truncate_prompt: bool = False,
             **options: Any) -> RayResult:
    """specdiff.generate over a Ray actor pool: the same outputs, in input order.
    address, ray_init (ray.init's keyword arguments): see `init`; the other Ray parameters: see
    `map_prompts`."""
    prompts = check_prompts(prompts)
    _check_options(options)
    _check_pool(workers, cpus_per_worker, gpus_per_worker, task_size, threads, truncate_prompt)
    if ray_init is not None and not isinstance(ray_init, dict):
        raise UsageError(f"`ray_init` must be a dict of ray.init's keyword arguments, got {type(ray_init).__name__}")
    init_s = init(address, **(ray_init or {}))
    ray = require("ray", "ray")
    start = time.perf_counter()
    ds = ray.data.from_items([{"index": i, "prompt": p} for i, p in enumerate(prompts)])
    done = map_prompts(ds, workers=workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                       task_size=task_size, threads=threads, truncate_prompt=truncate_prompt, **options)
    rows = sorted(_rows(done), key=lambda r: r["index"])
    outputs = [pickle.loads(r["output"]) for r in rows]
    batch_s = [float(s) for s in {int(r["batch"]): r["batch_s"] for r in rows}.values()]
    return RayResult(outputs, ray={"init_s": round(init_s, 3), "wall_s": round(time.perf_counter() - start, 3),
                                   "workers": workers, "batches": len(batch_s),
                                   "batch_s": [round(s, 3) for s in batch_s],
                                   "decode_s": round(sum(o.metrics.wall_s for o in outputs), 3)},
                     settings=json.loads(rows[0]["settings"]))


def iter_outputs(done: Any) -> Iterator[tuple[dict[str, Any], Any]]:
    """(row, generation.Output) of a map_prompts Dataset, streamed in the Dataset's order (set
    DataContext's execution_options.preserve_order for input order); a worker's SpecdiffError is
    raised when its row is reached."""
    for row in _rows(done):
        yield row, pickle.loads(row["output"])


def _rows(done: Any) -> Iterator[dict[str, Any]]:
    """Rows of the mapped Dataset; the first row a worker could not decode raises its error."""
    for row in done.iter_rows():
        if row["error"] is not None:
            raise pickle.loads(row["error"])
        yield row


def _check_options(options: dict[str, Any]) -> None:
    """What plan() will be given in each worker, checked on the driver before Ray starts: names
    (a misspelt keyword is an error, not a silently greedy run) and plain values."""
    check_keywords(options, (*PLAN_PARAMETERS, *OPTIONS))
    checked = {key: value for key, value in options.items() if key in OPTIONS}
    check_request(options.get("target"), options.get("drafter"), seed=options.get("seed", 0),
                  device=options.get("device", "cpu"), **checked)


def _check_pool(workers: int, cpus: float, gpus: float, task_size: int, threads: int | None = None,
                truncate_prompt: bool = False) -> None:
    check_threads(threads)
    check_flags(truncate_prompt=truncate_prompt)
    if not isinstance(workers, int) or workers < 1:
        raise UsageError(f"`workers` must be an integer >= 1, got {workers!r}")
    if not (isinstance(task_size, int) and task_size >= 1):
        raise UsageError(f"`task_size` must be an integer >= 1, got {task_size!r}")
    for name, value in (("cpus_per_worker", cpus), ("gpus_per_worker", gpus)):
        if not isinstance(value, (int, float)) or value < 0 or value != value or value == float("inf"):
            raise UsageError(f"`{name}` must be a finite number >= 0, got {value!r}")
    if cpus == 0 and gpus == 0:
        raise UsageError("a worker needs some resources: `cpus_per_worker` or `gpus_per_worker` > 0")

