"""Where an exported target's step goes on ONNX Runtime (issue 38, item 2): each width's median ms
after a cached context, then ONNX Runtime's own profiler summed by operator type over every call.
One JSON object on stdout.

    python scripts/ort_profile.py ~/.cache/specdiff/onnx/KEY --widths 1,5,9 --context 128

KEY: an export `specdiff export` (or `--runtime onnxruntime`'s cache) wrote; the session is opened
as specdiff's runtime opens it (one intra-op thread unless --threads, no spinning, every graph
optimisation). The past is random (the cost of a step does not depend on its values). The floor
of width w: max(the fp32 weights read once at the measured bandwidth, 2 FLOP per weight per token
at the measured matmul rate), as `specdiff bench` measures it (specdiff.tools.roofline)."""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort
import torch

from specdiff.runtimes.onnxruntime import session_options
from specdiff.tools.roofline import measure_peaks


def feeds(session: ort.InferenceSession, width: int, context: int, rng: np.random.Generator) -> dict[str, Any]:
    """One row: `width` new tokens after `context` cached ones (a causal additive mask)."""
    out: dict[str, Any] = {}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            heads, dim = i.shape[1], i.shape[3]
            out[i.name] = (0.1 * rng.standard_normal((1, heads, context, dim))).astype(np.float32)
    mask = np.triu(np.full((width, width), -np.inf, np.float32), k=1)
    full = np.concatenate([np.zeros((width, context), np.float32), mask], axis=1)[None, None]
    names = {i.name for i in session.get_inputs()}
    out |= {"input_ids": rng.integers(0, 1000, (1, width)), "position_ids": np.arange(context, context + width)[None]}
    out |= {name: full for name in ("attention_mask", "local_attention_mask") if name in names}
    return out


def open_session(export: Path, threads: int, profile: bool = False) -> ort.InferenceSession:
    """The target graph's session as specdiff's runtime opens it (profile: with ONNX Runtime's profiler on)."""
    options = session_options(ort, threads)
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    return ort.InferenceSession(str(export / "target.onnx"), options, providers=["CPUExecutionProvider"])


def median_ms(call: Callable[[], object], calls: int) -> float:
    """The median ms of `calls` calls after a first, untimed one."""
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - start))
    return round(statistics.median(times), 2)


def step_ms(session: ort.InferenceSession, width: int, context: int, calls: int, rng: np.random.Generator) -> float:
    """The median ms of `calls` steps of `width` tokens after `context`."""
    inputs = feeds(session, width, context, rng)
    return median_ms(lambda: session.run(None, inputs), calls)


def openvino_ms(export: Path, widths: list[int], args: argparse.Namespace, rng: np.random.Generator) -> dict[int, float]:
    """The same steps on OpenVINO's CPU plugin (`pip install openvino`), fp32, latency hint."""
    import openvino

    config = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = openvino.Core().compile_model(str(export / "target.onnx"), "CPU", config)
    request = compiled.create_infer_request()
    session = open_session(export, args.threads)  # the inputs' names and shapes
    inputs = {width: feeds(session, width, args.context, rng) for width in widths}
    return {width: median_ms(lambda: request.infer(inputs[width]), args.calls) for width in widths}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--widths", default="1,5,9")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--openvino", action="store_true", help="also time the same graph on OpenVINO's CPU plugin (fp32)")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    rng = np.random.default_rng(0)
    timed = open_session(args.export, args.threads)  # without the profiler, whose per-node timing costs time
    ms = {width: step_ms(timed, width, args.context, args.calls, rng) for width in widths}
    del timed
    other = {"openvino_ms": openvino_ms(args.export, widths, args, rng)} if args.openvino else {}
    torch.set_num_threads(args.threads)
    peaks = measure_peaks("cpu")
    weights = json.loads((args.export / "manifest.json").read_text())["components"]["target"]["bytes"]
    floor = {width: round(1e3 * max(weights / (peaks.read_gb_s * 1e9), width * 2 * weights / 4 / (peaks.gflop_s * 1e9)), 2)
             for width in widths}  # fp32 weights read once; 2 FLOP per weight per token
    session = open_session(args.export, args.threads, profile=True)
    for width in widths:
        step_ms(session, width, args.context, 2, rng)
    profile = Path(session.end_profiling())
    by_op: collections.Counter[str] = collections.Counter()
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    profile.unlink()
    total = sum(by_op.values())
    shares = {op: round(us / total, 4) for op, us in by_op.most_common(12)}
    print(json.dumps({"export": str(args.export), "context": args.context, "threads": args.threads,
                      "read_gb_s": peaks.read_gb_s, "gflop_s": peaks.gflop_s, "step_ms": ms, "floor_ms": floor,
                      "x_floor": {w: round(ms[w] / floor[w], 2) for w in widths},
                      "x_decode": {w: round(ms[w] / ms[widths[0]], 2) for w in widths}, "op_share": shares, **other}))


if __name__ == "__main__":
    main()
