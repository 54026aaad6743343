"""`specdiff generate`."""

from __future__ import annotations

import json
import sys

import click

from specdiff import names

from .output import check_output, open_output
from .prompts import escape_line, format_record, read_prompts


@click.command()
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="A prompt (repeatable).")
@click.option("--prompt-file", metavar="PATH", help="Prompts, one per line or JSONL; '-' for stdin.")
@click.option("--input-format", type=click.Choice(["auto", "text", "jsonl"]), default="auto",
              show_default=True, help="How to read the prompt file or stdin.")
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
@click.option("--acceptance", type=click.Choice(names.RULES),
              help="Verification rule [default: greedy at temperature 0, else standard].")
@click.option("--temperature", type=float, help="0 = greedy [default: 0].")
@click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = all).")
@click.option("--top-p", type=float, help="Nucleus mass in (0, 1].")
@click.option("--max-new-tokens", type=int, help="Tokens to generate per prompt [default: 64].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default="auto",
              show_default=True, help="auto: fp32 on CPU, fp16 on CUDA.")
@click.option("--runtime", type=click.Choice(["torch", "onnxruntime", "tensorrt"]), default="torch",
              show_default=True, help="What runs the models; onnxruntime / tensorrt need --artifacts.")
@click.option("--artifacts", metavar="DIR", help="A `specdiff export` directory: its target / drafter replace --target / --drafter.")
@click.option("--truncate-prompt", is_flag=True, help="Keep the end of prompts longer than the context window.")
@click.option("--jsonl", is_flag=True, help="Write JSONL records (input fields, text, metrics).")
@click.option("-o", "--output", metavar="PATH", callback=check_output,
              help="Write results here (a file: complete or not at all).")
@click.option("--stats", is_flag=True,
              help="Print the settings that ran (and where each came from) and aggregate metrics as JSON on stderr.")
@click.option("--stream/--no-stream", default=None,
              help="Print each continuation as it is produced [default: when stdout is a terminal].")
def generate(prompts, prompt_file, input_format, jsonl, output, stats, truncate_prompt, stream, **options):
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

    stream = _check_stream(stream, jsonl, output)
    records = read_prompts(prompts, prompt_file, getattr(sys.stdin, "buffer", None), input_format)
    options.update(runtime_models(options.pop("runtime"), options.pop("artifacts"), options))
    p = plan(**options)
    if stream:
        total = _stream(records, p, truncate_prompt)
        if stats and total is not None:
            click.echo(json.dumps({"method": p.method.name, "settings": p.settings(), **total.to_dict()}), err=True)
        return
    progress = len(records) > 1 and sys.stderr.isatty()
    outputs = iter_generate([r.prompt for r in records], p, truncate_prompt, progress)
    writer = open_output(output) if output else None
    total = None
    try:
        for record, out in zip(records, outputs):
            line = format_record(record, out.text, out.metrics.to_dict(), jsonl)
            writer.write(line) if writer else _print(line)
            total = out.metrics if total is None else total.merge(out.metrics)
        if writer:
            writer.commit()
    finally:
        if writer:
            writer.discard()
    if stats and total is not None:
        click.echo(json.dumps({"method": p.method.name, "settings": p.settings(), **total.to_dict()}), err=True)


def _check_stream(stream, jsonl: bool, output) -> bool:
    if stream and (jsonl or output):
        raise click.UsageError("--stream prints text as it is produced; it does not go with --jsonl or -o")
    return sys.stdout.isatty() and not (jsonl or output) if stream is None else stream


def _stream(records, p, truncate_prompt: bool):
    """Write each continuation's text as its tokens are accepted, one escaped line per prompt;
    -> total metrics."""
    from specdiff.generation import stream
    from specdiff.text import IncrementalText

    total, text = None, IncrementalText(p.target.tokenizer)
    for event in stream([r.prompt for r in records], p, truncate_prompt=truncate_prompt):
        if event.output is None:
            _write(escape_line(text.push(event.tokens)))
            continue
        _print(escape_line(text.finish(event.output.text)))
        text = IncrementalText(p.target.tokenizer)
        total = event.output.metrics if total is None else total.merge(event.output.metrics)
    return total


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # a reader such as `head -1` gets each result as soon as it exists
