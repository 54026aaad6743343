"""The cost of one target step by width, eager against --compile (issue: verify(16) / decode(1)):
`extend` of W tokens per row after a cached context, then rollback, timed (median of rounds)
for the eager per-row cache (targets.causal), the static cache run eager, and compiled.
One JSON object on stdout; compile time is reported apart.

    python scripts/step_costs.py --target demo-target --widths 1,9 --threads 1
    python scripts/step_costs.py --shape gpt2-xl --device cuda --dtype fp16 --widths 1,17   # random weights
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from specdiff.loading import load_target, resolve_dtype
from specdiff.resources import data_path
from specdiff.targets.causal import CausalLMTarget
from specdiff.targets.static import StaticTarget

SHAPES = {"gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25, n_positions=1024)}  # GPT-2 XL, 1.56B


def make_target(args) -> CausalLMTarget:
    if not args.shape:
        return load_target(args.target, device=args.device, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(data_path("models", "demo", "target"))  # ids < 1000 only
    config = GPT2Config(vocab_size=50257, **SHAPES[args.shape])
    with torch.device(args.device):
        model = GPT2LMHeadModel(config).to(resolve_dtype(args.dtype, args.device)).eval()
    return CausalLMTarget(model, tokenizer, f"{args.shape} (random weights)")


def step_ms(target, rows: int, width: int, context: int, rounds: int, calls: int) -> float:
    """Median over rounds of the mean ms of `calls` extends of `width` tokens per row."""
    g = torch.Generator().manual_seed(0)
    target.keep([])
    for _ in range(rows):
        target.join(torch.randint(0, 1000, (1, context), generator=g).to(target.device))
    x = torch.randint(0, 1000, (rows, width), generator=g).to(target.device)
    lengths = torch.full((rows,), context)
    times = []
    for r in range(rounds + 1):  # round 0 warms up (and compiles)
        target.sync()
        start = time.perf_counter()
        for _ in range(calls):
            target.extend(x)
            target.rollback(lengths)
        target.sync()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="a random-weight model of this shape instead")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--widths", default="1,9")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    eager = make_target(args)
    runs = {"eager": eager, "static": StaticTarget.of(eager, compile=False), "compiled": StaticTarget.of(eager)}
    out = {"target": eager.name, "device": str(eager.device), "dtype": str(eager.model.dtype), "rows": args.rows,
           "context": args.context, "threads": torch.get_num_threads(), "step_ms": {}}
    with torch.no_grad():
        for name, target in runs.items():
            ms = {w: step_ms(target, args.rows, w, args.context, args.rounds, args.calls) for w in widths}
            out["step_ms"][name] = {str(w): round(v, 3) for w, v in ms.items()}
            out["step_ms"][name]["ratio_to_width_1"] = {str(w): round(ms[w] / ms[widths[0]], 3) for w in widths}
    out["compile_s"] = round(runs["compiled"].step.warmup_s, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
