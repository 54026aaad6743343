"""`specdiff generate --ray`: the same prompts, results and records, decoded by a Ray actor pool
(specdiff.ray). Ray's own logging is kept to warnings; --stats adds Ray's timings."""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, TypeVar

import click

from specdiff.errors import InputError, UsageError

from .output import AtomicWriter, StreamWriter, open_output
from .prompts import Layout, decode_utf8, parse_line, read_line_bounded

if TYPE_CHECKING:
    from specdiff.metrics import Metrics
    from specdiff.ray import RayResult

WORKER_OPTIONS = ("ray", "workers", "cpus_per_worker", "gpus_per_worker")
DEFAULTS = (None, 2, 1.0, 0.0)
SHARD = 10_000  # results per --output-dir file
Pool = tuple[Optional[str], int, float, float]  # the WORKER_OPTIONS' values (--ray None: no Ray)
F = TypeVar("F", bound=Callable[..., Any])


def ray_options(command: F) -> F:
    """--ray [ADDRESS], --workers, --cpus-per-worker, --gpus-per-worker."""
    options = [
        click.option("--ray", metavar="ADDRESS", is_flag=False, flag_value="", default=None,
                     help="Decode on Ray: 'local' starts a local Ray, an address joins a cluster, no "
                          "value: $RAY_ADDRESS, else local (needs the specdiff[ray] extra)."),
        click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
                     help="With --ray: actors, each loading the models once."),
        click.option("--cpus-per-worker", type=click.FloatRange(min=0), default=1.0, show_default=True,
                     help="With --ray: CPUs each actor reserves (fractions allowed)."),
        click.option("--gpus-per-worker", type=click.FloatRange(min=0), default=0.0, show_default=True,
                     help="With --ray: GPUs each actor reserves (use --device cuda)."),
        click.option("--output-dir", metavar="DIR",
                     help=f"With --ray and --prompt-file: results in DIR/part-NNNNN files of {SHARD} each, "
                          "in input order; the file is read in chunks, never whole."),
    ]
    return functools.reduce(lambda c, option: option(c), reversed(options), command)


def check_ray_flags(pool: Pool, stream: bool | None, output_dir: str | None, prompt_file: str | None,
                    output: str | None) -> None:
    """The worker flags mean nothing without --ray; --stream needs the local loop; --output-dir
    reads a prompt file (not stdin) and replaces -o."""
    if pool[0] is None:
        if tuple(pool) != DEFAULTS or output_dir:
            raise click.UsageError("--workers, --cpus-per-worker, --gpus-per-worker and --output-dir go with --ray")
        return
    if stream:
        raise click.UsageError("--stream prints text as one process decodes it; it does not go with --ray")
    if output_dir and (output or not prompt_file or prompt_file == "-"):
        raise click.UsageError("--output-dir writes the results of a --prompt-file PATH; it replaces -o")


def run_on_ray(prompts: list[str], options: dict[str, Any], address: str | None, workers: int, cpus: float,
               gpus: float, threads: int | None, truncate_prompt: bool) -> RayResult:
    """-> specdiff.ray.RayResult, Ray quiet but for its warnings."""
    import specdiff.ray as sray

    with _own_ray():
        return sray.generate(prompts, address=address or None, ray_init=_quiet(), workers=workers,
                             cpus_per_worker=cpus, gpus_per_worker=gpus, threads=threads or max(1, int(cpus)),
                             truncate_prompt=truncate_prompt, **options)


# the workers' libraries as quiet as the CLI's (main._quiet_libraries): a worker's transformers
# warning ("Token indices sequence length is longer...") came before the error line it explains
WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _quiet() -> dict[str, Any]:
    """Keep Ray's warnings, progress lines and execution notes off stderr, and its results in
    input order; -> the ray.init arguments that do the same for Ray's own logger and the workers."""
    from ray.data import DataContext

    warnings.filterwarnings("ignore", module="ray")  # advice on pool sizes and deprecations
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its progress lines, once per second
    context = DataContext.get_current()
    context.print_on_execution_start = False
    context.execution_options.preserve_order = True
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # "(raylet)" without colour codes in a log file
    return {"logging_level": logging.ERROR, "runtime_env": {"env_vars": WORKER_ENV}}


@contextmanager
def _own_ray() -> Iterator[None]:
    """A Ray this command starts (or joins) ends with the block, before the command's last line
    (an error, --stats) is printed: no Ray message after it, no Ray process left behind. A Ray the
    caller started (a test's, a notebook's) is left running."""
    from specdiff.extras import require

    ray = require("ray", "ray")
    started = not ray.is_initialized()
    try:
        yield
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


MAX_CHUNKS = 4096  # read tasks of --output-dir's input, at most


@dataclass(frozen=True)
class Chunk:
    """Prompts first .. first + count - 1 of a prompt file lie in bytes [start, end)."""

    start: int
    end: int
    first: int
    count: int


def index_file(path: str, fmt: str, size: int) -> list[Chunk]:
    """Check every line of a prompt file as `generate` would, reading one line at a time, and cut
    it into chunks of `size` prompts, doubled (adjacent chunks merged) whenever there are more than
    MAX_CHUNKS: enough chunks to keep every worker busy, few enough to hold whatever the file's size."""
    chunks: list[Chunk] = []
    start, first, count, offset = 0, 0, 0, 0
    try:
        with open(path, "rb") as f:
            n = 0
            while raw := read_line_bounded(f, f"{path} line {n + 1}"):
                n += 1
                line = decode_utf8(raw.removesuffix(b"\n"), f"{path} line {n}")
                if parse_line(line.lstrip("\ufeff") if n == 1 else line, fmt, f"{path} line {n}"):
                    count += 1
                offset += len(raw)
                if count == size:
                    chunks.append(Chunk(start, offset, first, count))
                    start, first, count = offset, first + count, 0
                if len(chunks) > MAX_CHUNKS:
                    chunks, size = _merge_pairs(chunks), 2 * size
    except OSError as e:
        raise InputError(f"cannot read prompt file {path}: {e.strerror}") from None
    if count:
        chunks.append(Chunk(start, offset, first, count))
    if not chunks:
        raise InputError(f"{path} holds no prompts")
    return chunks


def _merge_pairs(chunks: list[Chunk]) -> list[Chunk]:
    pairs = zip(chunks[::2], chunks[1::2])
    merged = [Chunk(a.start, b.end, a.first, a.count + b.count) for a, b in pairs]
    return merged + chunks[len(merged) * 2:]


def read_chunk(chunk: dict[str, Any], path: str, fmt: str) -> list[dict[str, Any]]:
    """A Chunk's prompts (checked by index_file) as rows {"index", "prompt", "line"}; runs in Ray."""
    with open(path, "rb") as f:
        f.seek(chunk["start"])
        data = f.read(chunk["end"] - chunk["start"]).decode("utf-8")
    lines = data.removeprefix("\ufeff").split("\n") if chunk["start"] == 0 else data.split("\n")
    records = [(line, parse_line(line, fmt, path)) for line in lines]
    kept = [(line, r) for line, r in records if r is not None]
    return [{"index": chunk["first"] + i, "prompt": r.prompt, "line": line} for i, (line, r) in enumerate(kept)]



def run_to_dir(path: str, fmt: str, out_dir: str, layout: Layout, options: dict[str, Any], address: str | None,
               workers: int, cpus: float, gpus: float, threads: int | None, truncate_prompt: bool) -> Metrics | None:
    """--output-dir: a prompt file of any size, checked line by line here, read in chunks by Ray,
    decoded by the pool; results come back in input order into out_dir/part-NNNNN.{jsonl,txt} of
    SHARD results each (each file whole or absent). -> total metrics."""
    import specdiff.ray as sray

    fmt = _file_format(path, fmt)
    _check_shard_dir(out_dir)
    chunks = index_file(path, fmt, sray.TASK_SIZE)
    made = not os.path.exists(out_dir)
    directory = _shard_dir(out_dir)  # made once the file is known good: a refused run leaves none
    try:
        with _own_ray():
            sray.init(address or None, **_quiet())
            return _decode_to_dir(path, fmt, directory, layout, chunks, options, workers, cpus, gpus, threads,
                                  truncate_prompt)
    except BaseException:
        if made:
            with suppress(OSError):
                directory.rmdir()  # only if no shard was committed
        raise


def _decode_to_dir(path: str, fmt: str, directory: Path, layout: Layout, chunks: list[Chunk],
                   options: dict[str, Any], workers: int, cpus: float, gpus: float, threads: int | None,
                   truncate_prompt: bool) -> Metrics | None:
    import ray

    import specdiff.ray as sray

    ds = ray.data.from_items([asdict(c) for c in chunks]).flat_map(
        read_chunk,  # type: ignore[arg-type]  # ray's type of fn leaves out the fn_kwargs it is called with
        fn_kwargs={"path": os.path.abspath(path), "fmt": fmt})
    done = sray.map_prompts(ds, workers=workers, cpus_per_worker=cpus, gpus_per_worker=gpus,
                            threads=threads or max(1, int(cpus)), truncate_prompt=truncate_prompt, **options)
    suffix = "jsonl" if layout.mode == "jsonl" else "txt"
    total: Metrics | None = None
    writer: AtomicWriter | StreamWriter | None = None
    try:
        for row, out in sray.iter_outputs(done):
            i = int(row["index"])
            if i % SHARD == 0:
                writer = _next_shard(writer, layout, directory / f"part-{i // SHARD:05d}.{suffix}")
            record = parse_line(row["line"], fmt, path)
            assert writer is not None and record is not None  # index 0 opened a shard; rows are non-blank lines
            writer.write(layout.result(i % SHARD, record, out.text, out.metrics.to_dict()))
            total = out.metrics if total is None else total.merge(out.metrics)
        _next_shard(writer, layout, None)
    finally:
        if writer:
            writer.discard()
    return total


def _next_shard(writer: AtomicWriter | StreamWriter | None, layout: Layout,
                path: Path | None) -> AtomicWriter | StreamWriter | None:
    """Finish the current shard file (if any) and open the next (path None: none)."""
    if writer:
        writer.write(layout.end())
        writer.commit()
    return open_output(str(path)) if path else None


def _file_format(path: str, fmt: str) -> str:
    if fmt == "whole":
        raise UsageError("--output-dir reads a prompt file line by line; it does not go with --whole")
    if fmt != "auto":
        return fmt
    try:
        with open(path, "rb") as f:
            lines = iter(lambda: read_line_bounded(f, f"{path}: a line"), b"")
            first = next((line for line in lines if line.strip()), b"")
    except OSError as e:
        raise InputError(f"cannot read prompt file {path}: {e.strerror}") from None
    return "jsonl" if first.lstrip(b"\xef\xbb\xbf \t").startswith(b"{") else "text"


def _check_shard_dir(out_dir: str) -> None:
    """Refuse an output directory that holds shards of another run, or is not a directory."""
    directory = Path(out_dir)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"cannot make --output-dir {out_dir}: it is not a directory")
    if directory.is_dir() and any(directory.glob("part-*")):
        raise UsageError(f"--output-dir {out_dir} already holds part-* files; use an empty directory")


def _shard_dir(out_dir: str) -> Path:
    """The output directory, made if missing; refused if it holds shards of another run."""
    directory = Path(out_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot make --output-dir {out_dir}: {e.strerror}") from None
    _check_shard_dir(out_dir)
    return directory
