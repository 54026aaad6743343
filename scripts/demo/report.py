"""Step 8 of the demo build: greedy samples and per-call latencies of the trained demo models.

    python scripts/demo/report.py --target specdiff/data/models/demo/target \
        --drafter specdiff/data/models/demo/ar-drafter \
        --out build/demo/report.json

Samples: greedy continuations (--new-tokens) of the first prompt of each held-out source in
specdiff/data/prompts/heldout.jsonl, from the target and from the AR drafter, through
specdiff.generate (the `ar` method, i.e. the code path of hub models). Latency: median and minimum wall time of one target
call that appends 1 or 9 tokens to a cache of 128 (rolled back after each call), --threads torch
threads, batch 1, fp32; and the same for the drafter. Also `ar` versus `spec-ar` (gamma 4) tokens/s over
the held-out prompts, for orientation (specdiff bench is the real harness).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import specdiff
from specdiff.loading import load_target

PROMPTS = Path(__file__).parents[2] / "specdiff" / "data" / "prompts" / "heldout.jsonl"
CACHE, CALLS = 128, 30


def call_ms(target, new: int, cache: int = CACHE, calls: int = CALLS) -> dict:
    """Median and minimum ms of target.extend over `new` tokens after a `cache`-token prefill
    (the minimum is the better estimate on a machine shared with other jobs)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size - 2, (1, cache + new), generator=g)
    target.prefill(ids[:, :cache])
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        target.extend(ids[:, cache:])
        times.append((time.perf_counter() - t0) * 1e3)
        target.rollback(cache)
    return {"median": round(statistics.median(times), 2), "min": round(min(times), 2)}


def first_per_source(path: Path) -> list[dict]:
    rows, seen = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()], set()
    return [r for r in rows if not (r["source"].split(":")[0] in seen or seen.add(r["source"].split(":")[0]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter = load_target(args.target), load_target(args.drafter)
    report = {"threads": args.threads, "latency_ms": {}, "samples": []}
    for name, model in (("target", target), ("drafter", drafter)):
        call_ms(model, 1, calls=5)  # warm-up
        report["latency_ms"][name] = {f"{new}_new_on_{CACHE}": call_ms(model, new) for new in (1, 9)}
    for row in first_per_source(PROMPTS):
        sample = {"source": row["source"], "prompt": row["prompt"]}
        for name, model in (("target", target), ("drafter", drafter)):
            out = specdiff.generate(row["prompt"], target=model, method="ar", max_new_tokens=args.new_tokens)
            sample[name] = out.texts[0]
        report["samples"].append(sample)
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text(encoding="utf-8").splitlines()]
    for method in ("ar", "spec-ar"):
        m = specdiff.generate(prompts, target=target, drafter=args.drafter if method == "spec-ar" else None,
                              method=method, gamma=4, max_new_tokens=64).metrics
        report[method] = {"tokens_per_s": round(m.tokens_per_s, 1), "tau": round(m.tau, 3)}
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(report["latency_ms"]), json.dumps({k: report[k] for k in ("ar", "spec-ar")}))


if __name__ == "__main__":
    main()
