"""`specdiff generate`."""

from __future__ import annotations

import json
import sys

import click

from specdiff import names

from .output import check_output, open_output
from .prompts import Layout, read_prompts, unescape
from .threads import set_threads, threads_option


@click.command()
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="A prompt (repeatable).")
@click.option("--prompt-file", metavar="PATH", help="Prompts, one per line or JSONL; '-' for stdin.")
@click.option("--input-format", type=click.Choice(["auto", "text", "jsonl"]), default="auto",
              show_default=True, help="How to read the prompt file or stdin.")
@click.option("--whole", is_flag=True,
              help="The whole prompt file or stdin is one prompt (less one final line end).")
@click.option("--target", help="Target model: models.yaml name, directory or hub id [default: the demo pair].")
@click.option("--drafter", help="Drafter: models.yaml name, directory or hub id.")
@click.option("--pair", help="A models.yaml pair: target, drafter and their defaults.")
@click.option("--method", type=click.Choice(names.METHODS),
              help="Decoding method [default: the pair's, else from the drafter, else ar].")
@click.option("--gamma", type=int, help="Draft length [default: the pair's, else the drafter's, else 8].")
@click.option("--steps", type=int,
              help="Denoising steps T per draft [default: the pair's, else the drafter's, else 4; oneshot: 1].")
@click.option("--schedule", type=click.Choice(names.SCHEDULES),
              help="Order in which draft slots are committed [default: the pair's, else the drafter's, else l2r].")
@click.option("--drafts", type=int,
              help="K candidate drafts per step from one drafter call, the target keeping one (specdiff) [default: 1].")
@click.option("--draft-temperature", type=float,
              help="Temperature candidates 2..K are sampled at [default: --temperature, 1 when greedy].")
@click.option("--acceptance", type=click.Choice(names.RULES),
              help="Verification rule [default: greedy at temperature 0, else select with --drafts > 1, else standard].")
@click.option("--temperature", type=float, help="0 = greedy [default: 0].")
@click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = all).")
@click.option("--top-p", type=float, help="Nucleus mass in (0, 1].")
@click.option("--repetition-penalty", type=float,
              help="Hugging Face's repetition penalty on the target (1 = none) [default: 1].")
@click.option("--stop", multiple=True, metavar="TEXT",
              help="End a continuation at this text, which is left out (repeatable).")
@click.option("--chat", is_flag=True, help="Put each prompt through the target's chat template.")
@click.option("--system", metavar="TEXT", help="A system message for --chat.")
@click.option("--max-new-tokens", type=int, help="Tokens to generate per prompt [default: 64].")
@click.option("--seed", type=int, default=0, show_default=True)
@threads_option
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default="auto",
              show_default=True, help="auto: fp32 on CPU, fp16 on CUDA.")
@click.option("--runtime", type=click.Choice(["torch", "onnxruntime", "tensorrt"]), default="torch",
              show_default=True, help="What runs the models; onnxruntime / tensorrt need --artifacts.")
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
def generate(prompts, prompt_file, input_format, whole, jsonl, raw, separator, echo, output, stats,
             truncate_prompt, stream, **options):
    """Generate continuations of prompts: exactly the target's own output, faster.

    \b
    Examples:
      echo "To be, or not to be" | specdiff generate --stats     # the demo pair, offline
      specdiff generate --target gpt2 --drafter ./drafter --prompt "Hello"
      specdiff generate --pair gpt-neo-2.7B+mdlm-owt --prompt-file in.txt --jsonl
      cat prompts.jsonl | specdiff generate --target gpt2 --jsonl --stats | jq .text
    """
    from runtimes import runtime_models
    from specdiff.generation import iter_generate, plan

    layout = _layout(jsonl, raw, separator, echo)
    stream = _check_stream(stream, jsonl, output)
    records = read_prompts(prompts, prompt_file, getattr(sys.stdin, "buffer", None),
                           _input_format(whole, input_format))
    set_threads(options.pop("threads"))
    options.update(runtime_models(options.pop("runtime"), options.pop("artifacts"), options))
    p = plan(**options)
    if stream:
        _stats(stats, p, _stream(records, p, truncate_prompt, layout))
        return
    progress = len(records) > 1 and sys.stderr.isatty()
    outputs = iter_generate([r.prompt for r in records], p, truncate_prompt, progress)
    writer = open_output(output) if output else None
    write = writer.write if writer else _write
    total = None
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
    _stats(stats, p, total)


def _stats(wanted: bool, p, total) -> None:
    """--stats: the settings that ran and the aggregate metrics, one JSON line on stderr."""
    if wanted and total is not None:
        click.echo(json.dumps({"method": p.method.name, "settings": p.settings(), **total.to_dict()}), err=True)


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


def _check_stream(stream, jsonl: bool, output) -> bool:
    if stream and (jsonl or output):
        raise click.UsageError("--stream prints text as it is produced; it does not go with --jsonl or -o")
    return sys.stdout.isatty() and not (jsonl or output) if stream is None else stream


def _stream(records, p, truncate_prompt: bool, layout: Layout):
    """Write each continuation's text as its tokens are accepted, laid out as the whole result
    would be; -> total metrics."""
    from specdiff.generation import stream
    from specdiff.text import IncrementalText

    total, text, current = None, IncrementalText(p.target.tokenizer, p.text.stop), -1
    for event in stream([r.prompt for r in records], p, truncate_prompt=truncate_prompt):
        if event.index != current:  # a new prompt: its head, and a fresh text
            current, text = event.index, IncrementalText(p.target.tokenizer, p.text.stop)
            _write(layout.head(current, records[current]))
        if event.output is None:
            _write(layout.text(text.push(event.tokens)))
            continue
        _write(layout.text(text.finish(event.output.text)) + layout.tail())
        total = event.output.metrics if total is None else total.merge(event.output.metrics)
    _write(layout.end())
    return total


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # a reader such as `head -1` gets each result as soon as it exists
