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
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import SpecdiffError, UsageError
from .extras import require
from .generation import GenerationResult, plan
from .requests import check_keywords, check_prompts, check_request
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
    RAY_ADDRESS set) joins a cluster; None without RAY_ADDRESS starts a local one. -> seconds."""
    ray = require("ray", "ray")
    start = time.perf_counter()
    if not ray.is_initialized():
        address = None if address == "local" else address or os.environ.get("RAY_ADDRESS")
        try:
            ray.init(address=address, **ray_init)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UsageError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}") from e
    return time.perf_counter() - start


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
    _check_pool(workers, cpus_per_worker, gpus_per_worker, task_size)
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
    _check_pool(workers, cpus_per_worker, gpus_per_worker, task_size)
    init_s = init(address, **(ray_init or {}))
    ray = require("ray", "ray")
    start = time.perf_counter()
    ds = ray.data.from_items([{"index": i, "prompt": p} for i, p in enumerate(prompts)])
    done = map_prompts(ds, workers=workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                       task_size=task_size, threads=threads, truncate_prompt=truncate_prompt, **options)
    rows = sorted(_rows(done), key=lambda r: r["index"])
    outputs = [pickle.loads(r["output"]) for r in rows]
    batch_s = [float(s) for s in {int(r["batch"]): r["batch_s"] for r in rows}.values()]
    return RayResult(outputs, {"init_s": round(init_s, 3), "wall_s": round(time.perf_counter() - start, 3),
                               "workers": workers, "batches": len(batch_s),
                               "batch_s": [round(s, 3) for s in batch_s],
                               "decode_s": round(sum(o.metrics.wall_s for o in outputs), 3)},
                     json.loads(rows[0]["settings"]))


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


def _check_pool(workers: int, cpus: float, gpus: float, task_size: int) -> None:
    if not isinstance(workers, int) or workers < 1:
        raise UsageError(f"`workers` must be an integer >= 1, got {workers!r}")
    if not (isinstance(task_size, int) and task_size >= 1):
        raise UsageError(f"`task_size` must be an integer >= 1, got {task_size!r}")
    for name, value in (("cpus_per_worker", cpus), ("gpus_per_worker", gpus)):
        if not isinstance(value, (int, float)) or value < 0 or value != value or value == float("inf"):
            raise UsageError(f"`{name}` must be a finite number >= 0, got {value!r}")
    if cpus == 0 and gpus == 0:
        raise UsageError("a worker needs some resources: `cpus_per_worker` or `gpus_per_worker` > 0")

