"""Validation of an exported graph against the PyTorch module it was traced from, run through
the same runtime code that generation uses (specdiff.runtimes.onnxruntime).

The target sweep covers what decoding does to a step graph: prefill (empty past), verify steps of
5 tokens on a cache, single-token steps, roll-backs, batch 1 and 3, odd lengths (19), a draft
tree's mask (each node sees its ancestors). Every step feeds both sides the same inputs and the
PyTorch cache, and compares every output. The drafter sweep covers batch 1 and 3, context + draft
lengths, partly and fully masked rows. The DFlash sweep feeds context in chunks over the K/V the
graph returned (batch 1 and 3, rows left-padded in the first chunk and in later ones), every block
all mask slots after the anchor. The EAGLE-3 sweep feeds context rows in chunks, then draft steps
(each row its own previous output), all over the K/V the graph returned (batch 1 and 3, rows
left-padded in the first chunk and in later ones). All mismatches are collected, then one ExportValidationError
lists them; tolerances are specdiff.graphs.TOLERANCE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specdiff.graphs import (MASKS, TOLERANCE, TORCH_DTYPES, GraphSpec, additive_mask, axis_sizes, past_names,
                             present_names)
from specdiff.runtimes.onnxruntime import OrtRuntime
from specdiff.contracts import Runtime
from specdiff.errors import ExportValidationError, LoadError
from specdiff.targets.trees import ancestors

from .onnx import Graph


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    steps: tuple[int, ...]  # target: > 0 feeds that many tokens, < 0 rolls back that many;
    #                         drafter: (length, masked slots)
    tree: bool = False  # target: steps on a cache attend as a binary draft tree (node i's parent (i - 1) // 2)


TARGET_SWEEP = (
    Case("prefill 19", 1, (19,)),
    Case("prefill 6, verify 5, reject 3, verify 5, step 1", 1, (6, 5, -3, 5, 1)),
    Case("batch 3: prefill 19, verify 5", 3, (19, 5)),
    Case("batch 3: prefill 7, steps 1 1 2, verify 5, reject 4, step 1", 3, (7, 1, 1, 2, 5, -4, 1)),
    Case("batch 3: prefill 7, a tree of 6", 3, (7, 6), tree=True),
)
DRAFTER_SWEEP = (
    Case("19 tokens, 8 masked", 1, (19, 8)),
    Case("batch 3: 24 tokens, 8 masked", 3, (24, 8)),
    Case("batch 3: 5 tokens, all masked", 3, (5, 5)),
    Case("2 tokens, 1 masked", 1, (2, 1)),
)
DFLASH_SWEEP = (  # steps: context rows fed per call; in batch 3, row b's first 2b rows of each call are padding
    Case("context 19", 1, (19,)),
    Case("context 6, then 5, 1, 3", 1, (6, 5, 1, 3)),
    Case("batch 3, left-padded: context 7, then 5, 3", 3, (7, 5, 3)),
)

EAGLE3_SWEEP = (  # steps: > 0 context rows (from features) fed per call, 0 a draft step (one row from hidden)
    Case("context 19, then 3 draft steps", 1, (19, 0, 0, 0)),
    Case("context 6, then 5, 1, a draft step", 1, (6, 5, 1, 0)),
    Case("batch 3, left-padded: context 7, then 5, 2 draft steps", 3, (7, 5, 0, 0)),
)


class Comparison:
    """Collects mismatches and the largest |diff| per output family (logits, present)."""

    def __init__(self, dtype: str):
        self.atol, self.rtol = TOLERANCE[dtype]
        self.problems: list[str] = []
        self.checks = 0
        self.max_diff: dict[str, float] = {}

    def check(self, where: str, name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
        self.checks += 1
        got, ref = got.to(ref.device).float(), ref.float()
        if got.shape != ref.shape:
            self.problems.append(f"{where}: {name} shape {tuple(got.shape)} != {tuple(ref.shape)}")
            return
        diff = (got - ref).abs()
        family = name.split(".")[0]
        worst = float(diff.max()) if diff.numel() else 0.0
        self.max_diff[family] = max(self.max_diff.get(family, 0.0), worst)
        scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0  # graphs.TOLERANCE
        bad = ~(diff <= self.atol * scale + self.rtol * ref.abs())  # NaN counts as a mismatch
        if bad.any():
            self.problems.append(f"{where}: {name} {int(bad.sum())}/{diff.numel()} values off, "
                                 f"max |diff| {worst:.3g}")

    def summary(self, runtime: str, cases: Sequence[Case]) -> dict[str, Any]:
        return {"runtime": runtime, "cases": [c.name for c in cases], "checks": self.checks,
                "tolerance": {"atol": self.atol, "rtol": self.rtol, "atol_times": "max(1, max |torch|)"},
                "max_abs_diff": {k: float(f"{v:.3g}") for k, v in self.max_diff.items()},
                "passed": not self.problems}


def _run_target_case(module: Graph, spec: GraphSpec, runtime: Runtime, case: Case, dtype: str,
                     cmp: Comparison, mask_id: int | None) -> None:
    layers = sum(name.startswith("past_key_values.") for name in spec.input_names) // 2
    device = next(module.parameters()).device
    generator = torch.Generator().manual_seed(len(case.name))
    past: list[torch.Tensor] = []  # the cache: 2L tensors (B, H, P, D)
    for i, n in enumerate(case.steps):
        if n < 0:
            past = [t[:, :, : t.shape[2] + n] for t in past]
            continue
        sizes = axis_sizes(case.batch, n, past[0].shape[2] if past else 0)
        feeds = spec.dummy_inputs(sizes, dtype, generator, device)
        if case.tree and past:
            feeds.update(dict.fromkeys([m for m in MASKS if m in feeds], tree_mask(sizes, dtype).to(device)))
        feeds.update(zip(past_names(layers), past or []))
        ref = dict(zip(spec.output_names, module(*module.pack(spec, feeds))))
        got = runtime.run(feeds)
        for name in spec.output_names:
            cmp.check(f"{case.name} (step {i + 1})", name, got[name], ref[name])
        past = [ref[name] for name in present_names(layers)]


def tree_mask(sizes: dict[str, int], dtype: str) -> torch.Tensor:
    """The additive mask (batch, 1, seq_len, total_len) of a binary draft tree of seq_len nodes
    (node i's parent (i - 1) // 2) after past_len cached columns."""
    B, S, P = sizes["batch"], sizes["seq_len"], sizes["past_len"]
    parent = ((torch.arange(S) - 1) // 2).expand(B, S)  # the root's: -1
    allowed = torch.cat([torch.ones(B, S, P, dtype=torch.bool), ancestors(parent)], -1)
    return additive_mask(allowed, TORCH_DTYPES[dtype])


def run_drafter_case(module: Graph, spec: GraphSpec, runtime: Runtime, case: Case, dtype: str, cmp: Comparison,
                     mask_id: int | None) -> None:
    assert mask_id is not None, "a drafter graph is validated with its mask id"
    length, masked = case.steps
    device = next(module.parameters()).device
    feeds = spec.dummy_inputs(axis_sizes(case.batch, length), dtype, torch.Generator().manual_seed(length), device)
    feeds["input_ids"][:, length - masked:] = mask_id
    ref = dict(zip(spec.output_names, module(*module.pack(spec, feeds))))
    got = runtime.run(feeds)
    for name in spec.output_names:
        cmp.check(case.name, name, got[name], ref[name])


def run_dflash_case(module: Graph, spec: GraphSpec, runtime: Runtime, case: Case, dtype: str,
                    cmp: Comparison, mask_id: int | None) -> None:
    assert mask_id is not None, "a drafter graph is validated with its mask id"
    layers = (len(spec.inputs) - 4) // 2  # 4 inputs, then a key and a value per draft layer

    def feed(feeds: dict[str, torch.Tensor], n: int, last: dict[str, torch.Tensor]) -> None:
        feeds["block_ids"][:, 1:] = mask_id
        feeds["start"] = feeds["context_mask"].sum(1)  # the anchor follows every real row
    _calls_over_cache(module, spec, runtime, case, dtype, cmp,
                      (past_names(layers, "past_context"), present_names(layers, "present_context")), feed)


def run_eagle3_case(module: Graph, spec: GraphSpec, runtime: Runtime, case: Case, dtype: str,
                    cmp: Comparison, mask_id: int | None) -> None:
    def feed(feeds: dict[str, torch.Tensor], n: int, last: dict[str, torch.Tensor]) -> None:
        feeds["from_features"] = torch.full_like(feeds["from_features"], int(n > 0))
        if not n and last:  # a draft step reads the last call's output
            feeds["hidden"] = last["last_hidden"]
    _calls_over_cache(module, spec, runtime, case, dtype, cmp, (past_names(1), present_names(1)), feed)


def _calls_over_cache(module: Graph, spec: GraphSpec, runtime: Runtime, case: Case, dtype: str, cmp: Comparison,
                      kv: tuple[list[str], list[str]],
                      feed: Callable[[dict[str, torch.Tensor], int, dict[str, torch.Tensor]], None]) -> None:
    """A drafter graph's calls over the K/V it returned (kv: its past and present names): call i
    feeds max(n, 1) new rows for n = case.steps[i] (in batch 3 with n > 0, row b's first 2b of
    them padding), context_mask over every row held and new; feed(inputs, n, the last call's
    torch outputs) sets the rest."""
    device = next(module.parameters()).device
    generator = torch.Generator().manual_seed(len(case.name))
    past: list[torch.Tensor] = []
    ref: dict[str, torch.Tensor] = {}
    mask = torch.zeros(case.batch, 0, dtype=torch.long)  # (B, rows held)
    for i, n in enumerate(case.steps):
        feeds = spec.dummy_inputs(axis_sizes(case.batch, max(n, 1), mask.shape[1]), dtype, generator, device)
        new = torch.ones(case.batch, max(n, 1), dtype=torch.long)
        for b in range(case.batch if n else 0):
            new[b, :min(2 * b, n - 1)] = 0
        mask = torch.cat([mask, new], dim=1)
        feeds.update(context_mask=mask.to(device), **dict(zip(kv[0], past)))
        feed(feeds, n, ref)
        ref = dict(zip(spec.output_names, module(*module.pack(spec, feeds))))
        got = runtime.run(feeds)
        for name in spec.output_names:
            cmp.check(f"{case.name} (call {i + 1})", name, got[name], ref[name])
        past = [ref[name] for name in kv[1]]


# (module, spec, runtime, case, dtype, comparison, mask id: a drafter's) -> None: one case run on both sides
RunCase = Callable[[Graph, GraphSpec, Runtime, Case, str, Comparison, "int | None"], None]


@dataclass(frozen=True)
class Sweep:
    """The cases a graph is validated on and how one runs (a drafter graph's: exporters.drafters)."""

    cases: Sequence[Case]
    run: RunCase


TARGET = Sweep(TARGET_SWEEP, _run_target_case)


def _open(path: Path, device: torch.device) -> OrtRuntime:
    """ONNX Runtime on the module's device when it has a provider for it, else on the CPU."""
    if device.type == "cuda":
        try:
            return OrtRuntime(path, device)
        except LoadError:
            pass  # CPU build of onnxruntime: validate on the CPU instead
    return OrtRuntime(path, "cpu")


@torch.no_grad()
def validate(module: Graph, spec: GraphSpec, path: Path, dtype: str, mask_id: int | None = None,
             sweep: Sweep = TARGET) -> dict[str, Any]:
    """Run the sweep (a drafter graph's with its mask id); -> summary for the manifest. Raises ExportValidationError
    listing every mismatch. bf16 graphs are skipped (summary says why) where onnxruntime cannot
    run them (its CPU provider has no bf16 kernels)."""
    device = next(module.parameters()).device
    try:
        runtime = _open(path, device)
    except LoadError as e:
        if dtype != "bf16":
            raise
        detail = str(e).rsplit(": ", 1)[-1]
        return {"runtime": None, "passed": None, "skipped": f"onnxruntime cannot run this bf16 graph here ({detail})"}
    cmp = Comparison(dtype)
    for case in sweep.cases:
        sweep.run(module, spec, runtime, case, dtype, cmp, mask_id)
    if cmp.problems:
        raise ExportValidationError(path.name, cmp.problems, cmp.checks)
    return cmp.summary(f"onnxruntime-{runtime.device.type}", sweep.cases)
