"""torch's linear layers by call width on this CPU (issue 38, item 4: what `--compile` could gain
from oneDNN's prepacked linears): a decoder's every projection, layer after layer, through
torch's own `F.linear` (what eager and inductor's default call) and through oneDNN with the
weight reordered once (`torch.ops.mkldnn._linear_pointwise`, what inductor's freezing emits on
CPU), each width's best of --repeats runs, beside the floor (the weights read once at the measured
bandwidth, or their 2 FLOP per weight per token at the measured matmul rate, whichever is more:
specdiff.tools.roofline). One JSON object on stdout.

    python scripts/linear_widths.py --widths 1,2,5,9,17   # SmolLM2-135M's shapes by default

Random fp32 weights of the model's shapes (a projection's time does not depend on its values), one
thread. Run it with nothing else on the machine: memory bandwidth is shared."""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch
import torch.nn.functional as F

from specdiff.tools.roofline import measure_peaks


def projections(layers: int, dim: int, kv_dim: int, ffn: int) -> list[torch.Tensor]:
    """A Llama-style decoder's weights (out, in): q, k, v, o, gate, up, down per layer."""
    shapes = [(dim, dim), (kv_dim, dim), (kv_dim, dim), (dim, dim), (ffn, dim), (ffn, dim), (dim, ffn)]
    return [torch.randn(o, i) / i ** 0.5 for _ in range(layers) for o, i in shapes]


def best_ms(run: Callable[[], None], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="1,2,5,9,17")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--dim", type=int, default=576)
    parser.add_argument("--kv-dim", type=int, default=192)
    parser.add_argument("--ffn", type=int, default=1536)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    weights = projections(args.layers, args.dim, args.kv_dim, args.ffn)
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    params = sum(w.numel() for w in weights)
    peaks = measure_peaks()
    widths: dict[str, dict[str, dict[str, float]]] = {}
    for width in map(int, args.widths.split(",")):
        floor_ms = 1e3 * max(4 * params / (peaks.read_gb_s * 1e9), 2 * params * width / (peaks.gflop_s * 1e9))
        xs = {n: torch.randn(width, n) for n in {w.shape[1] for w in weights}}

        def eager() -> None:
            for w in weights:
                F.linear(xs[w.shape[1]], w)

        def onednn() -> None:
            for w, p in zip(weights, packed):
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")

        ms = {"F.linear": best_ms(eager, args.repeats), "onednn_packed": best_ms(onednn, args.repeats)}
        widths[str(width)] = {k: {"ms": round(v, 2), "x_floor": round(v / floor_ms, 2)} for k, v in ms.items()}
        widths[str(width)]["floor"] = {"ms": round(floor_ms, 2)}
    print(json.dumps({"weights_mb": 4 * params / 1e6, "peaks": peaks.to_dict(), "widths": widths}))


if __name__ == "__main__":
    main()
