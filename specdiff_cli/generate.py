"""`specdiff generate`."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterator, cast

import click

from specdiff import names
from specdiff.settings import help_text

from .flags import DEFAULT_PAIR, Gamma, check_pair, check_setting
from .output import check_output, check_stdout, open_output
from .prompts import Layout, read_prompts, unescape
from .prompts import PromptRecord
from .ray_run import WORKER_OPTIONS, Pool, check_ray_flags, ray_options, run_on_ray, run_to_dir
from .threads import set_threads, threads_option

if TYPE_CHECKING:
    from specdiff.generation import Event, Output, Plan
    from specdiff.generation.tuned import Tuned
    from specdiff.metrics import Metrics
    from specdiff.text import IncrementalText


PAIR, PAIR_DRAFTER = "the pair's, else ", "the pair's, else the drafter's, else "


@click.command()
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="A prompt (repeatable).")
@click.option("--prompt-file", metavar="PATH", help="Prompts, one per line or JSONL; '-' for stdin.")
@click.option("--input-format", type=click.Choice(["auto", "text", "jsonl"]), default="auto",
              show_default=True, help="How to read the prompt file or stdin.")
@click.option("--whole", is_flag=True,
              help="The whole prompt file or stdin is one prompt (less one final line end).")
@click.option("--target", help=f"Target model: models.yaml name, directory or hub id [default: the target of "
              f"{DEFAULT_PAIR}].")
@click.option("--drafter", help="Drafter: models.yaml name, directory or hub id.")
@click.option("--pair", callback=check_pair,
              help=f"A models.yaml pair: target, drafter and their defaults [default: {DEFAULT_PAIR}].")
@click.option("--method", type=click.Choice(names.METHODS),
              help="Decoding method [default: the pair's, else from the drafter, else ar].")
@click.option("--gamma", callback=check_setting, type=Gamma(),
              help="Draft length, fixed (an integer), or auto: chosen each step from the "
              "acceptance so far and measured costs, 0 (a plain step) to the pair's, else the drafter's, else "
              "8 [default: auto].")
@click.option("--steps", callback=check_setting, type=int,
              help=help_text("steps", PAIR_DRAFTER) + " Block-diffusion targets: the block size. oneshot: 1.")
@click.option("--schedule", type=click.Choice(names.SCHEDULES), help=help_text("schedule", PAIR_DRAFTER))
@click.option("--remasking", type=click.Choice(names.REMASKING), help=help_text("remasking"))
@click.option("--threshold", callback=check_setting, type=float, help=help_text("threshold"))
@click.option("--drafts", callback=check_setting, type=int, help=help_text("drafts") + " specdiff only.")
@click.option("--tree", callback=check_setting, type=Gamma(),
              help=help_text("tree") + " dflash, spec-ar, specdiff (with --steps 1); the depth bound is --gamma "
                   "(an integer, or auto's cap with --tree auto).")
@click.option("--draft-temperature", callback=check_setting, type=float,
              help="Temperature candidates 2..K are sampled at [default: --temperature, 1 when greedy].")
@click.option("--acceptance", type=click.Choice(names.RULES),
              help="Verification rule [default: greedy at temperature 0, else select with --drafts > 1, else standard].")
@click.option("--temperature", callback=check_setting, type=float, help=help_text("temperature", PAIR))
@click.option("--top-k", callback=check_setting, type=int, help=help_text("top_k", PAIR))
@click.option("--top-p", callback=check_setting, type=float, help=help_text("top_p", PAIR))
@click.option("--repetition-penalty", callback=check_setting, type=float,
              help=help_text("repetition_penalty", PAIR))
@click.option("--stop", multiple=True, metavar="TEXT",
              help="End a continuation at this text, which is left out (repeatable).")
@click.option("--chat/--no-chat", default=None, help=help_text("chat", PAIR))
@click.option("--system", metavar="TEXT", help="A system message for --chat.")
@click.option("--max-new-tokens", callback=check_setting, type=int, help=help_text("max_new_tokens", PAIR))
@click.option("--seed", callback=check_setting, type=int, default=0, show_default=True)
@click.option("--batch-size", callback=check_setting, type=int, help=help_text("batch_size", PAIR))
@threads_option
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default="auto",
              show_default=True, help="auto: fp32 on CPU, fp16 on CUDA.")
@click.option("--runtime", type=click.Choice(["torch", "onnxruntime", "tensorrt"]),
              help="What runs the models. onnxruntime without --artifacts: the models exported once into the user "
              "cache (a minute or two) and reused; tensorrt needs --artifacts [default: tuned (`specdiff tune`), "
              "else torch].")
@click.option("--compile", is_flag=True,
              help="torch runtime: static KV cache and torch.compile'd steps: the same tokens, compiled "
                   "before the first prompt decodes (seconds to a minute, warmup_s in --stats). Pays at batch "
                   "1 on long jobs and with inductor's cache warm; on a CPU at batch 8 it did not (docs/compile.md).")
@click.option("--artifacts", metavar="DIR", help="A `specdiff export` directory: its target / drafter replace --target / --drafter.")
@click.option("--truncate-prompt", is_flag=True, help="Keep the end of prompts longer than the context window.")
@click.option("--jsonl", is_flag=True, help="Write JSONL records (input fields with prompt, text, metrics).")
@click.option("--raw", is_flag=True,
              help="Write continuations as they are, not escaped, separated by a blank line (or --separator).")
@click.option("--separator", metavar="TEXT",
              help="Between raw continuations (implies --raw); \\n \\t \\r \\\\ are understood [default: '\\n\\n'].")
@click.option("--echo", is_flag=True,
              help="Write each prompt before its continuation (--jsonl records always hold it).")
@click.option("-o", "--output", metavar="PATH", callback=check_output,
              help="Write results here (a file: complete or not at all).")
@click.option("--stats", is_flag=True,
              help="Print the settings that ran (and where each came from) and aggregate metrics as JSON on stderr.")
@click.option("--stream/--no-stream", default=None,
              help="Print each continuation as it is produced [default: when stdout is a terminal].")
@ray_options
def generate(prompts: tuple[str, ...], prompt_file: str | None, input_format: str, whole: bool, jsonl: bool,
             raw: bool, separator: str | None, echo: bool, output: str | None, stats: bool, truncate_prompt: bool,
             stream: bool | None, **options: Any) -> None:
    """Generate continuations of prompts: exactly the target's own output, faster.

    \b
    Examples:
      echo "What does zip() do?" | specdiff generate --stats     # the default pair, offline
      specdiff generate --pair demo --prompt "To be, or not to be" --temperature 0.8 --seed 1
      cat prompts.jsonl | specdiff generate --jsonl --stats | jq .text
      specdiff generate --prompt-file big.txt --ray local --workers 2 -o out.txt
      specdiff generate --pair gpt-neo-2.7B+mdlm-owt --prompt-file in.txt   # hub models: network
    """
    from specdiff.generation import iter_generate

    layout = _layout(jsonl, raw, separator, echo)
    pool, output_dir = cast(Pool, tuple(options.pop(name) for name in WORKER_OPTIONS)), options.pop("output_dir")
    check_ray_flags(pool, stream, output_dir, prompt_file, output)
    check_stdout(output or output_dir)
    stream = _check_stream(stream, jsonl, output) and pool[0] is None
    if output_dir:
        assert prompt_file is not None  # check_ray_flags: --output-dir reads a --prompt-file
        total = run_to_dir(prompt_file, _input_format(whole, input_format), output_dir, layout,
                           _ray_options(options), *pool, options.pop("threads"), truncate_prompt)
        if stats and total is not None:
            click.echo(json.dumps(total.to_dict()), err=True)
        return
    records = read_prompts(prompts, prompt_file, getattr(sys.stdin, "buffer", None),
                           _input_format(whole, input_format))
    threads = options.pop("threads")
    if pool[0] is not None:
        _ray(records, options, pool, threads, truncate_prompt, layout, output, stats)
        return
    p, where = _planned(options, threads)
    if stream:
        _stats(stats, p, _stream(records, p, truncate_prompt, layout), where)
        return
    progress = len(records) > 1 and sys.stderr.isatty()
    outputs = iter_generate([r.prompt for r in records], p, truncate_prompt, progress)
    _stats(stats, p, _write_results(records, outputs, layout, output), where)


def _planned(options: dict[str, Any], threads: int | None) -> tuple[Plan, dict[str, Any]]:
    """The local run's plan: the tuned configuration where nothing is chosen (_tuned), the threads
    set, the models on their runtime (onnxruntime without --artifacts: exported once into the user
    cache) -> (the plan, the runtime and where it came from, for --stats)."""
    from specdiff.runtimes import runtime_models
    from specdiff.generation import plan

    runtime_given = options["runtime"] is not None
    tuned, threads = _tuned(options, threads)
    options["runtime"] = options["runtime"] or "torch"
    set_threads(threads)
    if options["compile"] and options["runtime"] != "torch":
        raise click.UsageError("--compile is for the torch runtime; exported graphs are compiled by their runtime")
    runtime, artifacts = options.pop("runtime"), options.pop("artifacts")
    if runtime == "onnxruntime" and not artifacts:
        from specdiff.exporters.cache import export_for
        from specdiff.registry import as_registry

        registry = as_registry(None)
        if options["pair"] is None and options["target"] is None:
            options["pair"] = registry.default_pair()  # its settings (chat, gamma) apply to the graphs as to torch
        artifacts = str(export_for(options["pair"], options.pop("target"), options.pop("drafter"), options["method"],
                                   registry))
    options.update(runtime_models(runtime, artifacts, options))
    p = plan(**options, tuned=tuned)
    where = {"runtime": {"value": runtime, "from": tuned.where if tuned else "option" if runtime_given else "default"}}
    return p, where


def _tuned(options: dict[str, Any], threads: int | None) -> tuple[Tuned | None, int | None]:
    """Where no model, method, draft setting or runtime is given (nor --compile), the configuration
    `specdiff tune` recorded for the default pair on this machine (generation.tuned.lookup): its
    pair and runtime set here, its method, gamma and tree in the plan (option > tuned > pair), its
    threads unless given. -> (the record or None, threads)."""
    from specdiff.generation.tuned import lookup
    from specdiff.registry import as_registry

    record = lookup(options, as_registry(None))
    if record is None:
        return None, threads
    options["pair"], options["runtime"] = record.config["pair"], record.config["runtime"]
    return record, threads or record.config["threads"]


def _ray(records: list[PromptRecord], options: dict[str, Any], pool: Pool, threads: int | None,
         truncate_prompt: bool, layout: Layout, output: str | None, stats: bool) -> None:
    """--ray: the prompts decoded by a Ray actor pool, written as a local run writes them."""
    result = run_on_ray([r.prompt for r in records], _ray_options(options), *pool, threads, truncate_prompt)
    total = _write_results(records, iter(result.outputs), layout, output)
    if stats and total is not None:
        click.echo(json.dumps({**result.settings, **total.to_dict(), "ray": result.ray}), err=True)


def _ray_options(options: dict[str, Any]) -> dict[str, Any]:
    if options.pop("runtime") not in (None, "torch") or options.pop("artifacts"):
        raise click.UsageError("--ray runs the torch runtime (each worker loads --target / --drafter)")
    return options


def _write_results(records: list[PromptRecord], outputs: Iterator[Output], layout: Layout,
                   output: str | None) -> Metrics | None:
    """Write each result as it comes, in input order, to -o (whole or nothing) or stdout;
    -> total metrics."""
    writer = open_output(output) if output else None
    write = writer.write if writer else _write
    total: Metrics | None = None
    try:
        for i, (record, out) in enumerate(zip(records, outputs)):
            write(layout.result(i, record, out.text, out.metrics.to_dict()))
            total = out.metrics if total is None else total.merge(out.metrics)
        write(layout.end())
        if writer:
            writer.commit()
    finally:
        if writer:
            writer.discard()
    return total


def _stats(wanted: bool, p: Plan, total: Metrics | None, runtime: dict[str, Any]) -> None:
    """--stats: the method, whether its output is its reference's (methods: `exact`), the settings
    that ran (the runtime among them) and the aggregate metrics, one JSON line on stderr."""
    if wanted and total is not None:
        warmup = {"warmup_s": round(p.warmup_s, 6)} if p.compiled else {}
        click.echo(json.dumps({"method": p.method.name, "exact": p.method.exact, "settings": p.settings() | runtime,
                               **total.to_dict(), **warmup}), err=True)


def _layout(jsonl: bool, raw: bool, separator: str | None, echo: bool) -> Layout:
    raw = raw or separator is not None
    if raw and jsonl:
        raise click.UsageError("--raw and --separator write plain text; they do not go with --jsonl")
    mode = "jsonl" if jsonl else "raw" if raw else "escaped"
    return Layout(mode, "\n\n" if separator is None else unescape(separator), echo and not jsonl)


def _input_format(whole: bool, input_format: str) -> str:
    if whole and input_format == "jsonl":
        raise click.UsageError("--whole reads one plain-text prompt; it does not go with --input-format jsonl")
    return "whole" if whole else input_format


def _check_stream(stream: bool | None, jsonl: bool, output: str | None) -> bool:
    if stream and (jsonl or output):
        raise click.UsageError("--stream prints text as it is produced; it does not go with --jsonl or -o")
    return sys.stdout.isatty() and not (jsonl or output) if stream is None else stream


def _stream(records: list[PromptRecord], p: Plan, truncate_prompt: bool, layout: Layout) -> Metrics | None:
    """Write each continuation's text as its tokens are accepted, laid out as the whole result
    would be, in input order: the earliest unfinished prompt streams, the steps of prompts after
    it (decoded in the same batch) wait and are written when their turn comes; -> total metrics."""
    from specdiff.generation import stream

    writer = _InOrder(p, records, layout)
    waiting: defaultdict[int, list[Event]] = defaultdict(list)
    for event in stream([r.prompt for r in records], p, truncate_prompt=truncate_prompt):
        waiting[event.index].append(event)
        while writer.current in waiting and writer.show(waiting.pop(writer.current)):
            pass  # that prompt finished: the next one's steps so far, if any
    _write(layout.end())
    return writer.total


class _InOrder:
    """Writes the events of prompt `current`, then of the next prompt, and so on."""

    def __init__(self, p: Plan, records: list[PromptRecord], layout: Layout):
        self.p, self.records, self.layout = p, records, layout
        self.current = -1
        self.total: Metrics | None = None
        self.text: IncrementalText  # the current prompt's, set by _next
        self._next()

    def _next(self) -> None:
        from specdiff.text import IncrementalText

        self.current += 1
        self.text = IncrementalText(self.p.target.tokenizer, self.p.text.stop)
        if self.current < len(self.records):
            _write(self.layout.head(self.current, self.records[self.current]))

    def show(self, events: list[Event]) -> bool:
        """Write events of the current prompt; True when they finish it (the next is current)."""
        _write(self.layout.text("".join(self.text.push(e.tokens) for e in events if e.output is None)))
        done = events[-1].output
        if done is None:
            return False
        _write(self.layout.text(self.text.finish(done.text)) + self.layout.tail())
        self.total = done.metrics if self.total is None else self.total.merge(done.metrics)
        self._next()
        return True


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # a reader such as `head -1` gets each result as soon as it exists
