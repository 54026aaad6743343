"""Side-by-side speed of decoding methods on the same target weights and prompts.

    models, defaults = load_models(target="gpt2-xl", drafter="./drafter", ar_drafter="gpt2")
    report = run(models, prompts, variants(["ar", "specdiff"], gammas=[4, 8]), Settings())
    write_report(report, "bench-out")

Methods: `ar`, `spec-ar`, `specdiff` run specdiff's own loop (generation.plan / iter_generate);
`hf-assisted` (transformers assisted generation with the AR drafter, a constant
num_assistant_tokens = gamma, confidence early exit off) and `hf-prompt-lookup`
(prompt_lookup_num_tokens = gamma) are the peers a user would pick instead. `ar` always runs first:
it is the reference for speed-ups, for c_1 and for the greedy token-by-token check.

Each method: `warmup` untimed passes over all prompts, then `repeats` timed passes (tokens/s =
new tokens / decoding seconds per pass; medians and spread over passes). Every forward call is
logged by hooks (callstats.py), which gives call counts and costs, the draft/verify/other time
split, and tau / alpha / accepted lengths for every method, HF peers included (for batched
variants, where one call serves several prompts, tau / alpha come from the loop's own per-prompt
metrics). Ideal speed-up:
S_ideal = tau * c_1 / (c_v + n_d * c_d) (docs/lossless.md), n_d = drafter calls per
verification (T for specdiff, gamma for an AR drafter).

Batch sizes (`batch_sizes`): specdiff's own methods also run with several prompts per forward pass
(a variant per batch size; the HF peers only at batch 1). A variant's tokens/s is then the
throughput of its batches (new tokens / decoding seconds), `tokens_per_s_per_row` that over the
batch size, and `memory.kv_cache_peak_mb` the largest KV cache its batches held.

Rooms: config (Models, Variant, Settings, load_models), sweep (variants: the rows), passes (one
typed Pass per method), measure (timing, memory, environment), report (rows, speed-ups, checks);
this module runs them. Its output: tools/bench_output.py; block-diffusion targets: tools/bench_block.py.
May import: the library, tools.callstats, tools.roofline and tools.invariance; never the CLI.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...errors import UsageError
from ...generation import TextOptions, encode_prompts, torch_threads
from ...targets.block import BlockDiffusionTarget
from ...targets.causal import CausalLMTarget
from .config import DEFAULT_PROMPTS, METHODS, NEEDS, Models, Settings, Variant, default_prompts, load_models
from .measure import CpuLoad, environment, memory_of, time_variants
from ..invariance import width_invariance
from ..roofline import measure_peaks, weight_cost
from .passes import PASSES
from .report import SPREAD_LIMIT, Floor, make_report, row_of, spread, unreliable
from .sweep import available_methods, check_models, check_rules, fits, variants

__all__ = ["DEFAULT_PROMPTS", "METHODS", "NEEDS", "PASSES", "SPREAD_LIMIT", "CpuLoad", "Models", "Settings",
           "Variant", "available_methods", "check_rules", "default_prompts", "environment", "fits", "load_models",
           "run", "spread", "unreliable", "variants"]


def run(models: Models, prompts: list[str], rows: list[Variant], settings: Settings,
        log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Time every variant on the prompts; -> the report (what bench.json holds)."""
    if settings.repeats < 1 or settings.warmup < 0:
        raise UsageError("repeats must be >= 1 and warmup >= 0")
    refs = [Variant("ar", temperature=t) for t in dict.fromkeys([v.temperature for v in rows] or [None])]
    rows = refs + [v for v in rows if v not in refs]  # the batch-1 reference at every temperature first
    check_models(models, rows)
    encoded = encode_prompts(models.target, prompts, settings.max_new_tokens, settings.truncate_prompt,
                             TextOptions(chat=settings.chat))
    _check_room(models.target, rows, encoded, settings.max_new_tokens)
    with torch_threads(settings.threads):
        with CpuLoad() as load:
            repeats, warmups = time_variants(models, rows, settings, prompts, encoded, log)
        out = [(row_of(v, r, encoded, memory_of(r), w, models.draft_vocab(v)), r)
               for v, r, w in zip(rows, repeats, warmups)]
        env = environment(models, load)
        floor = _floor(models)
        invariance = _invariance(models, {v.runtime for v in rows}, encoded[0] + repeats[0][0].tokens[0])
    report = make_report(out, settings, env, {"prompts": len(prompts), "models": models.names()}, floor, invariance)
    report["prompt_texts"] = prompts  # and what each row answered to them, to read beside ar's answers
    decode = models.target.tokenizer.decode
    for row, (_, passes) in zip(report["rows"], out):
        row["texts"] = [decode(tokens, skip_special_tokens=True) for tokens in passes[0].tokens]
    return report


def _invariance(models: Models, runtimes: set[str], ids: list[int]) -> dict[str, Any]:
    """Each runtime's width invariance (tools/invariance.py) on the first prompt and ar's answer
    to it; the compiled runtime's static-cache target is made per plan, so it is not probed."""
    targets = {"torch": models.target, **{r: g["target"] for r, g in models.graphs.items() if r in runtimes}}
    if not isinstance(models.target, CausalLMTarget):
        return {}
    return {runtime: width_invariance(target, ids) for runtime, target in targets.items()}


def _floor(models: Models) -> Floor | None:
    """The device's peaks and the target's step cost (tools/roofline.py), measured after the timed
    passes with the same threads; None for a target that is not a Hugging Face causal LM."""
    model = getattr(models.target, "model", None)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_input_embeddings"):
        return None
    return measure_peaks(str(models.target.device)), weight_cost(model)


def _check_room(target: CausalLMTarget | BlockDiffusionTarget, rows: list[Variant], encoded: list[list[int]], max_new_tokens: int) -> None:
    """transformers' prompt lookup does not cap its draft at the context window, so near the end a
    verify call would run past the position embeddings: refuse such settings up front."""
    gamma = max((v.gamma for v in rows if v.method == "hf-prompt-lookup" and isinstance(v.gamma, int)), default=0)
    longest = max(map(len, encoded))
    if gamma and longest + max_new_tokens + gamma > target.max_length:
        raise UsageError(
            f"hf-prompt-lookup g={gamma}: a {longest}-token prompt + {max_new_tokens} new tokens + gamma passes "
            f"the target's context window of {target.max_length} (transformers does not cap prompt-lookup "
            "drafts there); use shorter prompts, a lower `max_new_tokens`, or leave hf-prompt-lookup out")
