"""tau / alpha of a diffusion drafter against the demo target, greedy and at a temperature, on the
held-out prompts of a `specdiff distill` data/ directory: the evaluation of distill's report.json,
for a drafter that distill did not write (the shipped one, a checkpoint), so runs compare on the
same prompts.

    python scripts/demo/eval_drafter.py DRAFTER --data build/demo/gen/data [--temperature 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdiff.loading import load_drafter, load_target
from specdiff.training.config import DistillConfig
from specdiff.training.evaluation import evaluate_drafter
from specdiff.training.teacher import read_sequences


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter")
    ap.add_argument("--data", type=Path, required=True, help="a distill run's data/ directory")
    ap.add_argument("--target", default="specdiff/data/models/demo/target")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _, val, spec = read_sequences(args.data)
    cfg = DistillConfig(target=args.target, out="-", prompts=spec.prompts, gamma=args.gamma, steps_per_draft=1,
                        eval_prompts=args.prompts, continuation_tokens=spec.continuation_tokens,
                        samples_per_prompt=spec.samples_per_prompt, seed=args.seed,
                        eval_temperature=args.temperature)
    target = load_target(args.target, dtype="fp32")
    print(json.dumps(evaluate_drafter(cfg, target, load_drafter(args.drafter), val, spec.prompt_tokens)))


if __name__ == "__main__":
    main()
