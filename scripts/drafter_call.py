"""The DFlash drafter's call on an exported pair (issue 38, item 6): mean ms inside the method's
drafting step (methods.dflash.DFlashDrafts.__call__) against mean ms inside the drafter graph's own
runtime call, over a generate run of held-out questions. One JSON object on stdout.

    python scripts/drafter_call.py ~/.cache/specdiff/onnx/KEY --batch-size 1

KEY: an export of a target with a DFlash drafter (`specdiff export --pair smol-dflash`, or the cache
entry `--runtime onnxruntime` writes)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import torch

from specdiff.generation import generate
from specdiff.methods import dflash
from specdiff.resources import data_path
from specdiff.runtimes import load_models


def timed(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        spent.append(time.perf_counter() - start)
        return out
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    graphs = load_models("onnxruntime", args.export, "cpu")
    lines = data_path("prompts", "smol-heldout.jsonl").read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines[:args.prompts]]
    options: dict[str, Any] = dict(target=graphs["target"], drafter=graphs["drafter"], method="dflash", gamma=4,
                                   chat=True)
    generate(prompts[:1], max_new_tokens=8, **options)  # warm-up
    call: list[float] = []
    graph: list[float] = []
    runtime = graphs["drafter"].runtime
    runtime.run = timed(runtime.run, graph)  # type: ignore[method-assign]
    dflash.DFlashDrafts.__call__ = timed(dflash.DFlashDrafts.__call__, call)  # type: ignore[method-assign]
    start = time.perf_counter()
    generate(prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, **options)
    wall = time.perf_counter() - start
    call_ms, graph_ms = 1e3 * sum(call) / len(call), 1e3 * sum(graph) / len(graph)
    print(json.dumps({"batch_size": args.batch_size, "calls": len(call), "call_ms": round(call_ms, 2),
                      "graph_ms": round(graph_ms, 2), "ratio": round(call_ms / graph_ms, 3), "wall_s": round(wall, 2)}))


if __name__ == "__main__":
    main()
