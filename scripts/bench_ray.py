"""Ray's cost beside a local run, in one process on one machine (issue: `--ray local --workers 2`
at least 0.8x the local run on 64 prompts). Each run is timed end to end, as a user waits for it:
local = plan (model loading) + generate; ray = Ray's start + the pool (actors, model loading,
decoding): `ray.end_to_end_s`, of which `ray.init_s` starts Ray and `ray.wall_s` runs the pool. Outputs must be identical. One JSON object on stdout.

    python scripts/bench_ray.py --prompts 64 --workers 2 --out bench-ray.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import specdiff.ray as sray
from specdiff.generation import GenerationResult, iter_generate, plan
from specdiff.tools.bench import DEFAULT_PROMPTS


def heldout(n: int) -> list[str]:
    with open(DEFAULT_PROMPTS, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return [prompts[i % len(prompts)] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpus-per-worker", type=float, default=0.9)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--local-threads", default="1,2", help="Thread counts of the local runs (comma-separated).")
    ap.add_argument("--out", help="Also write the JSON here.")
    args = ap.parse_args()
    prompts = heldout(args.prompts)
    options = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    runs = {f"local_{t}_thread": _local(prompts, t, options) for t in map(int, args.local_threads.split(","))}
    start = time.perf_counter()
    result = sray.generate(prompts, address="local", workers=args.workers, threads=1,
                           cpus_per_worker=args.cpus_per_worker, **options)
    wall = time.perf_counter() - start
    report = {"prompts": args.prompts, **options, "workers": args.workers,
              **{k: {key: v for key, v in r.items() if key != "texts"} for k, r in runs.items()},
              "ray": {"end_to_end_s": round(wall, 3), **result.ray,
                      "decode_tokens_per_s": round(result.metrics.tokens_per_s, 2)},
              "identical": all(r["texts"] == result.texts for r in runs.values())}
    best_local = min(r["wall_s"] for r in runs.values())
    report["ray_speed_vs_best_local"] = round(best_local / wall, 3)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def _local(prompts: list[str], threads: int, options: dict) -> dict:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    result = GenerationResult(list(iter_generate(prompts, plan(**options))))
    return {"threads": threads, "wall_s": round(time.perf_counter() - start, 3), "texts": result.texts,
            "decode_tokens_per_s": round(result.metrics.tokens_per_s, 2)}


if __name__ == "__main__":
    main()
