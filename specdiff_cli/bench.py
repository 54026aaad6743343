"""`specdiff bench`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar, cast

import click

from specdiff import names

from .flags import DEFAULT_PAIR, check_pair, check_setting, flag_names, gamma, to_flags
from .prompts import read_prompts
from .threads import default_threads, threads_option

if TYPE_CHECKING:
    from specdiff.tools.bench import Models, Settings

T = TypeVar("T")


def _graphs(runtime: str, exports: Sequence[str], models: Models, device: str, threads: int) -> dict[str, Any]:
    """The first export's drafter on `runtime` and each later export's drafter (`others`: those of
    --also-drafter, in order), all drafting over one target graph: the first export's that outputs
    hidden states (a DFlash drafter or an EAGLE-3 head reads them; a diffusion drafter reads none,
    so the pair's own export may not have them), else the first's, the only target graph opened;
    their sessions opened with the bench's threads; refused unless exported from the bench's own
    target and drafters (graphs of another model with the same tokenizer were timed against it,
    and their speed-up reported)."""
    from specdiff.artifacts import open_artifacts
    from specdiff.runtimes import load_models
    from specdiff.generation import torch_threads

    arts = [open_artifacts(path) for path in exports]
    reader = next((i for i, art in enumerate(arts)
                   if art.component("target") is not None and art.record("target")["model"].get("feature_layers")), 0)
    loaded = []
    with torch_threads(threads):
        for i, (art, drafter) in enumerate(zip(arts, [models.drafter, *models.others])):
            sources = {"target": models.target.name, "drafter": getattr(drafter, "source", None)}
            kinds = ("target", "drafter") if i == reader else ("drafter",)
            loaded.append(load_models(runtime, art, device, sources=sources, kinds=kinds))
    return {**loaded[0], "target": loaded[reader]["target"], "others": [graphs["drafter"] for graphs in loaded[1:]]}


def _check_one_target_graph(models: Models) -> None:
    """Every drafter drafts over one exported target graph (_graphs), which outputs the hidden
    states of one set of layers: drafters that read different ones (a DFlash drafter and an EAGLE-3
    head made apart) are refused from the loaded drafters, before the exports (minutes each)."""
    from specdiff.errors import UsageError
    from specdiff.exporters.drafters import EXPORTERS
    from specdiff.kinds import kind_of
    from specdiff.loading import pair_models

    read: dict[str, tuple[int, ...]] = {}
    for drafter in [d for d in (models.drafter, *models.others) if d is not None]:
        kind = kind_of(drafter)
        if kind is None or kind.graph is None or not kind.graph.features:
            continue
        pair_models(models.target, drafter)  # an EAGLE-3 head naming no layers reads its target's default ones
        read[getattr(drafter, "source", "")] = EXPORTERS[kind.graph.name].features(drafter)
    if len(set(read.values())) > 1:
        shown = ", ".join(f"'{name}' reads {list(layers)}" for name, layers in read.items())
        raise UsageError(f"--runtime onnxruntime: the drafters draft over one exported target graph, which outputs "
                         f"one set of the target's hidden states; {shown}: bench each of them in a run of its own "
                         "with --runtime onnxruntime, or both without --runtime (torch)")


def _list(kind: Callable[[str], T], what: str = "", choices: Sequence[T] = (), setting: str = "") -> Callable[
        [click.Context, click.Parameter, str | None], tuple[T, ...] | None]:
    """A click callback: 'a,b' -> (kind('a'), kind('b')); None stays None. what: the items, as
    the errors name them (default: kind's name, plural); choices: the items allowed, checked here,
    before any model loads (none: any); setting: the declared setting each item is a value of,
    checked here too (settings.py). A value listed twice is refused (it would be two rows of
    one label), in every list option alike."""
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[T, ...] | None:
        from specdiff.requests import check_settings

        if value is None:
            return None
        try:
            items = tuple(kind(x.strip()) for x in value.split(",") if x.strip())
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list of {what or kind.__name__ + 's'}, "
                                     f"got {value!r}") from None
        if not items:
            raise click.BadParameter("empty list")
        for x in items if setting else ():
            check_settings({setting: x})
        unknown = [x for x in items if choices and x not in choices]
        if unknown:
            raise click.BadParameter(f"unknown {what} '{unknown[0]}' (choose from {', '.join(map(str, choices))})")
        twice = next((x for i, x in enumerate(items) if x in items[:i]), None)
        if twice is not None:
            raise click.BadParameter(f"{twice} is listed twice (each value is one row): give it once")
        return items
    return parse


def _report_dir(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Refuse an --out that cannot become a directory before the models load, not after the run."""
    from specdiff.errors import UsageError
    from specdiff.tools.bench_output import check_report_dir

    try:
        check_report_dir(value)
    except UsageError as e:
        raise click.BadParameter(str(e), ctx, param) from e
    return value


@click.command()
@click.option("--pair", callback=check_pair, help=f"A models.yaml pair [default without --target: {DEFAULT_PAIR}].")
@click.option("--target", help="Target model: models.yaml name, directory or hub id.")
@click.option("--drafter", help="Diffusion drafter (or a causal LM, used as the AR drafter).")
@click.option("--ar-drafter", help="Causal-LM drafter for spec-ar and hf-assisted [default: the pair's ar_drafter].")
@click.option("--also-drafter", "others", multiple=True, metavar="NAME",
              help="Another drafter, of another kind (an EAGLE-3 head beside a DFlash drafter): the rows of its "
                   "methods draft with it, in the same run (repeatable).")
@click.option("--methods", callback=_list(str, "method", (*names.METHODS, *names.PEERS)), metavar="LIST",
              help=f"Comma-separated, from {', '.join((*names.METHODS, *names.PEERS))} "
                   "[default: every one the models allow]. ar always runs: it is the reference.")
@click.option("--prompt-file", metavar="PATH", help="Prompts, one per line or JSONL [default: the pair's held-out prompts, else the 32 held-out "
              "demo prompts shipped in the package].")
@click.option("--prompt-set", metavar="NAME", help="A held-out set shipped in the package instead: smol-general (what "
              "people ask a chat model: the smol pairs' default), smol-heldout (Python standard-library questions), "
              "heldout (prompts for the `demo` pair).")
@click.option("--input-format", type=click.Choice(["auto", "text", "jsonl"]), default="auto", show_default=True)
@click.option("--num-prompts", type=click.IntRange(min=1), help="Use only the first N prompts.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Tokens per prompt [default: pair's, else 64].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Timed passes per method.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Untimed passes first.")
@click.option("--gamma", "gammas", callback=_list(gamma, "integers or auto"), metavar="LIST",
              help="Draft lengths to sweep: integers (fixed) and auto (chosen each step, up to the pair's, else "
                   "the drafter's, else 8) [default: auto and that gamma].")
@click.option("--steps", callback=_list(int), metavar="LIST",
              help="Denoising steps T to sweep (specdiff) [default: the pair's, else the drafter's, else 4].")
@click.option("--schedule", "schedules", callback=_list(str, "schedule", names.SCHEDULES), metavar="LIST",
              help="Schedules to sweep (specdiff): l2r, oneshot, confidence [default: the pair's, "
                   "else the drafter's, else l2r].")
@click.option("--drafts", callback=_list(int), metavar="LIST",
              help="Candidate drafts K to sweep (specdiff; self-selection when K > 1) [default: 1].")
@click.option("--draft-temperature", type=float, help="Temperature candidates 2..K are sampled at.")
@click.option("--tree", "trees", callback=_list(gamma, "integers or auto", setting="tree"), metavar="LIST",
              help="Draft tree sizes N to sweep (dflash, spec-ar, specdiff at steps 1, on integer --gamma: the "
                   "depth bound; 0 = a chain; "
                   "auto: chosen each step) [default: 0].")
@click.option("--acceptance", "rules", callback=_list(str), metavar="LIST",
              help="Acceptance rules to sweep for spec-ar / specdiff, each on the rows it fits (single-draft "
                   "rules for K = 1, greedy / select / multi for K > 1, greedy only at temperature 0) "
                   "[default: greedy at temperature 0, else select for K > 1, else standard].")
@click.option("--temperature", "temperatures", callback=_list(float, setting="temperature"), metavar="LIST",
              help="Temperatures to sweep, each with its own ar reference; 0 = greedy [default: 0].")
@click.option("--top-k", type=click.IntRange(min=0), callback=check_setting, default=0, show_default=True,
              help="Sampling rows: top-k (0 = all).")
@click.option("--top-p", type=float, callback=check_setting, default=1.0, show_default=True,
              help="Sampling rows: nucleus mass in (0, 1].")
@click.option("--batch-size", "batch_sizes", callback=_list(int), metavar="LIST",
              help="Prompts per forward pass to sweep, e.g. 1,4,8,16 (ar, spec-ar, specdiff; the HF peers "
                   "run batch 1) [default: 1].")
@click.option("--compile", "compiled", is_flag=True,
              help="Also run ar / spec-ar / specdiff compiled (static KV cache, torch.compile), each beside "
                   "its eager row; compile time is reported apart (compile_s) and timed in no pass.")
@click.option("--artifacts", metavar="DIR",
              help="A `specdiff export` directory: also run ar and specdiff on its graphs with --runtime.")
@click.option("--runtime", type=click.Choice(["onnxruntime", "tensorrt"]),
              help="Also run ar and specdiff on graphs with this runtime: --artifacts' [default with --artifacts: "
                   "onnxruntime]; onnxruntime without --artifacts: the bench's models exported once into the user "
                   "cache and reused.")
@click.option("--seed", type=int, callback=check_setting, default=0, show_default=True)
@click.option("--out", default="bench-out", show_default=True, metavar="DIR", callback=_report_dir,
              help="Where bench.json and the plots go.")
@click.option("--check", is_flag=True, help="Exit 1 if any method's greedy output differs from ar's (the rows at "
              "temperature 0; sampled rows are exact in distribution, which a token check cannot show).")
@threads_option
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default="auto", show_default=True)
@click.option("--truncate-prompt", is_flag=True, help="Keep the end of prompts longer than the context window.")
@click.option("--chat/--no-chat", default=None,
              help="Put each prompt through the target's chat template [default: the pair's, else no].")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots [without matplotlib: skipped, with a note].")
def bench(pair: str | None, target: str | None, drafter: str | None, ar_drafter: str | None, others: tuple[str, ...],
          methods: tuple[str, ...] | None, prompt_file: str | None, prompt_set: str | None, input_format: str,
          num_prompts: int | None,
          max_new_tokens: int | None, repeats: int, warmup: int, gammas: tuple[int | str, ...] | None,
          steps: tuple[int, ...] | None, schedules: tuple[str, ...] | None, drafts: tuple[int, ...] | None,
          trees: tuple[int | str, ...] | None, draft_temperature: float | None, rules: tuple[str, ...] | None,
          temperatures: tuple[float, ...] | None,
          top_k: int, top_p: float, batch_sizes: tuple[int, ...] | None, compiled: bool, artifacts: str | None,
          runtime: str | None, seed: int, out: str, check: bool, threads: int | None, device: str, dtype: str,
          truncate_prompt: bool, chat: bool | None, no_plots: bool) -> None:
    """Time plain decoding, AR-drafted and diffusion-drafted speculative decoding and Hugging Face
    assisted generation side by side on the same target; check every greedy output against ar.

    \b
    Examples:
      specdiff bench --pair demo --gamma 4,8 --num-prompts 8 --repeats 1     # about a minute, offline
      specdiff bench --pair smol --methods ar,specdiff --num-prompts 2 --repeats 1 --check   # a few minutes
      specdiff bench --pair demo --methods ar,specdiff --drafts 1,4 --acceptance select,multi \\
          --temperature 0,0.8 --top-p 0.95
      specdiff bench --pair demo --methods ar,specdiff --batch-size 1,4,8,16 --threads 1
      specdiff bench --pair demo --methods ar,specdiff --gamma auto,2,4,8 --batch-size 1,4,8,16 --temperature 0,0.7,1
      specdiff bench --pair demo --methods ar,specdiff --compile --artifacts demo-onnx --threads 1
      specdiff bench --pair smol-dflash --methods ar,dflash --runtime onnxruntime --threads 1
      specdiff bench --pair smol-dflash --methods dflash --gamma 4 --tree 0,8,auto --threads 1   # chain vs trees
      specdiff bench --target gpt2-xl --drafter mdlm-owt --ar-drafter gpt2 --check   # hub models: network
    Each row decodes every prompt (default: all the pair's held-out ones) --warmup + --repeats times.
    The last line on stdout is a JSON summary; DIR/bench.json holds every figure.
    """
    from specdiff.generation import choose, values
    from specdiff.tools import bench as lib
    from specdiff.tools.bench_output import format_table, require_matplotlib, summary, write_report
    from specdiff.errors import UsageError

    lib.check_rules(rules or ())
    if artifacts and others:
        raise UsageError("--also-drafter with --artifacts: an export holds one drafter; use --runtime onnxruntime "
                         "without --artifacts (each drafter exported with the target into the user cache)")
    plots = not no_plots and _can_plot(require_matplotlib)  # said before the long run, not after it
    if prompt_file and prompt_set:
        raise UsageError("give --prompt-file or --prompt-set, not both")
    records = read_prompts((), prompt_file or str(lib.default_prompts(pair, target, prompt_set=prompt_set)),
                           sys.stdin.buffer, input_format)
    prompts = [r.prompt for r in records][:num_prompts]
    models, defaults = lib.load_models(pair=pair, target=target, drafter=drafter, ar_drafter=ar_drafter, others=others,
                                       methods=methods or (), device=device, dtype=dtype)
    pick = values(choose({}, defaults, models.drafter))  # the pair's, the drafter's, then the global ones
    settings = lib.Settings(
        max_new_tokens=max_new_tokens or pick["max_new_tokens"], repeats=repeats, warmup=warmup,
        temperature=temperatures[0] if temperatures else pick["temperature"],
        acceptance=pick.get("acceptance"), top_k=top_k, top_p=top_p, draft_temperature=draft_temperature,
        seed=seed, threads=threads or default_threads(), truncate_prompt=truncate_prompt,
        chat=pick["chat"] if chat is None else chat, gamma_cap=pick["gamma"])
    swept = gammas or (("auto",) if pick["adaptive"] else ()) + (pick["gamma"],)  # auto beside its cap, fixed
    if check and 0 not in (temperatures or (settings.temperature,)):
        raise UsageError("--check compares greedy outputs token by token; it needs 0 among --temperature")
    if getattr(models.target, "kind", None) == "block-diffusion":
        if compiled or artifacts or runtime:
            raise UsageError("--compile, --artifacts and --runtime run causal LM targets; block-diffusion targets "
                             "run eager")
        unread = [flag for flag, value in (("--schedule", schedules), ("--drafts", drafts), ("--tree", trees),
                                           ("--acceptance", rules),
                                           ("--batch-size", batch_sizes), ("--draft-temperature", draft_temperature))
                  if value] + ["--temperature (more than one)"] * (len(temperatures or ()) > 1)
        if unread:
            raise UsageError(f"{', '.join(unread)}: not read on a block-diffusion target (bench sweeps --steps and "
                             "--gamma there)")
        if "auto" in (gammas or ()):
            raise UsageError("--gamma auto: block-diffusion methods take integer gammas")
        _bench_block(lib, models, prompts, methods, settings, steps or (pick["steps"],),
                     cast(tuple[int, ...], gammas or (pick["gamma"],)), pick, out, check)
        return
    exports = [artifacts] if artifacts else []
    if runtime is not None and artifacts is None:
        if runtime != "onnxruntime":
            raise UsageError(f"--runtime {runtime} needs --artifacts (engines are built by `specdiff export`)")
        _check_one_target_graph(models)
        from specdiff.exporters.cache import cached_export, export_for
        from specdiff.registry import as_registry

        registry = as_registry(None)
        exports = [str(export_for(pair, target, drafter, None, registry))]  # the target named, or refused
        named = cast(str, registry.resolve(pair, target, None)[0])
        exports += [str(cached_export(named, name, registry)) for name in others]
        artifacts = exports[0]
    runtime = runtime or "onnxruntime"
    rows = lib.variants(methods or lib.available_methods(models), swept,
                        steps or (pick["steps"],), schedules or (pick["schedule"],), drafts or (None,),
                        rules or (None,), temperatures if temperatures and len(temperatures) > 1 else (None,),
                        batch_sizes or (1,), ("torch",) + ("compiled",) * compiled + (runtime,) * bool(artifacts),
                        trees or (None,))
    if artifacts:
        models.graphs[runtime] = _graphs(runtime, exports, models, device, settings.threads or default_threads())
    report = lib.run(models, prompts, rows, settings, log=lambda msg: click.echo(msg, err=True))
    write_report(report, out, plots=plots)
    click.echo(format_table(report))
    _warn_mismatches(report)
    _warn_unreliable(report)
    _warn_run(report)
    click.echo(json.dumps(summary(report, Path(out))))
    if check and report["check"]["passed"] is False:
        raise click.ClickException(f"greedy outputs differ from ar: {', '.join(report['check']['mismatched'])}")


def _bench_block(lib: ModuleType, models: Models, prompts: list[str], methods: Sequence[str] | None,
                 settings: Settings, steps: Sequence[int | None], gammas: Sequence[int | None], pick: dict[str, Any],
                 out: str, check: bool) -> None:
    """A block-diffusion target: block, simsd-exact, simsd (specdiff.tools.bench_block); the table,
    DIR/bench.json, warnings and the JSON summary line, as for a causal target (one report shape)."""
    from specdiff.tools.bench_block import BLOCK_METHODS, format_block_table, run_block
    from specdiff.tools.bench_output import summary, write_report

    methods = methods or (BLOCK_METHODS if models.drafter is not None else ("block",))
    report = run_block(models, prompts, methods, settings, steps=steps, gammas=gammas, remasking=pick["remasking"],
                       threshold=pick["threshold"], log=lambda msg: click.echo(msg, err=True))
    write_report(report, out, plots=False)  # bench.json, written whole or not at all
    click.echo(format_block_table(report))
    _warn_unreliable(report)
    _warn_run(report)
    click.echo(json.dumps(summary(report, Path(out))))  # the same line as a causal target's
    if check and report["check"]["passed"] is False:
        raise click.ClickException(f"greedy outputs differ from block: {', '.join(report['check']['mismatched'])}")


def _can_plot(require_matplotlib: Callable[[], object]) -> bool:
    """Without matplotlib the plots are skipped with a note: the figures are in bench.json anyway."""
    from specdiff.errors import LoadError

    try:
        require_matplotlib()
    except LoadError as e:
        click.echo(f"specdiff: note: {e}; skipping the plots (the table and bench.json are still written; "
                   "--no-plots silences this note)", err=True)
        return False
    return True


def _warn_unreliable(report: dict[str, Any]) -> None:
    """A speed-up the rounds disagree on is said so on stderr, with what to do about it."""
    for row in report["rows"]:
        if row["unreliable"]:
            click.echo(f"specdiff: warning: {row['label']}: speed-up {row['speedup']:.2f}x is unreliable: "
                       f"{'; '.join(row['unreliable'])}", err=True)
    if report["reliability"]["advice"]:
        click.echo(f"specdiff: warning: {to_flags(report['reliability']['advice'], flag_names(bench))}", err=True)


BUSY = 0.25  # CPU cores other processes may keep busy before bench says its speeds are off


def _warn_run(report: dict[str, Any]) -> None:
    """What makes a whole run's speeds doubtful: one timed pass per row (nothing shows their
    spread), or other processes keeping more than BUSY of a core busy while it timed."""
    if report["config"]["repeats"] == 1:
        click.echo("specdiff: warning: --repeats 1: one timed pass per row, so nothing shows how much its speed "
                   "varies from pass to pass; --repeats 3 or more shows the spread", err=True)
    load, cpus = report["environment"].get("foreign_cpu_load"), report["environment"].get("cpus")
    if isinstance(load, float) and load > BUSY:
        click.echo(f"specdiff: warning: other processes kept {load:.2f} CPU cores busy (of {cpus}) while bench "
                   "timed: its speeds are lower and noisier than on a quiet machine", err=True)


def _warn_mismatches(report: dict[str, Any]) -> None:
    n = report["config"]["prompts"]
    for row in report["rows"]:
        if row["mismatches"]:
            first = row["mismatches"][0]
            click.echo(f"specdiff: MISMATCH: {row['label']}: greedy output differs from ar in "
                       f"{len(row['mismatches'])} of {n} prompts (first: prompt {first['prompt']}, token "
                       f"{first['position']}: ar {first['ar']}, got {first['got']})", err=True)
