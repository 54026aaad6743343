"""`specdiff bench` on the tiny models: every method runs on the same target, the report holds the
documented figures, the call-log accounting agrees with the loop's own metrics, the plots are
PNGs, and a deliberately wrong acceptance rule is caught by the greedy check."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specdiff import acceptance, generate, methods
from specdiff.registry import load_registry
from specdiff.errors import UsageError
from specdiff.tools.bench import METHODS, Settings, available_methods, load_models, run, variants
from specdiff.tools.invariance import width_invariance
from specdiff_cli.main import cli

PROMPTS = ["The quick brown fox", "To be, or not to be", "def main():"]
ROW_FIELDS = {"label", "method", "gamma", "steps", "schedule", "tokens_per_s", "speedup", "speedup_range", "roofline",
              "width_invariance",
              "new_tokens", "wall_s", "iterations", "tau", "alpha", "per_position_acceptance",
              "accepted_length_histogram", "time_s", "calls", "call_cost_s", "ideal", "memory",
              "matches_ar", "mismatches"}
PNG = b"\x89PNG\r\n\x1a\n"


def accept_all(draft, q, p, generator=None):
    """A broken rule: keeps every draft token whatever the target says."""
    return torch.full((draft.shape[0],), draft.shape[1]), p[:, -1].argmax(-1)


@pytest.fixture
def broken_rule(monkeypatch):
    """accept_all registered as a rule, and as one specdiff may run."""
    monkeypatch.setitem(acceptance.RULES, "accept-all", accept_all)
    specdiff = methods.METHODS["specdiff"]
    monkeypatch.setitem(methods.METHODS, "specdiff", replace(specdiff, rules=("accept-all", *specdiff.rules)))


@pytest.fixture(scope="module")
def self_drafted(tiny):
    """Every method, with the target as its own AR drafter (so alpha = 1 for spec-ar and hf-assisted)."""
    models, _ = load_models(target=str(tiny.gpt2), drafter=str(tiny.drafter), ar_drafter=str(tiny.gpt2))
    rows = variants(available_methods(models), gammas=(2, 3), steps=(1, 2))  # dflash: its own test below
    settings = Settings(max_new_tokens=10, repeats=2, warmup=1, threads=1)
    return models, settings, run(models, PROMPTS, rows, settings)


def test_every_method_runs_with_every_figure_and_matches_ar(self_drafted):
    _, _, report = self_drafted
    rows = report["rows"]
    assert [r["label"] for r in rows][0] == "ar" and {r["method"] for r in rows} == set(METHODS) - {"dflash", "eagle3"}
    assert {r["label"] for r in rows if r["method"] == "specdiff"} == {
        "specdiff g=2 T=1 l2r", "specdiff g=2 T=2 l2r", "specdiff g=3 T=1 l2r", "specdiff g=3 T=2 l2r"}
    assert report["check"] == {"greedy": True, "passed": True, "mismatched": []}
    assert report["environment"]["threads"] == 1 and report["environment"]["torch"] == torch.__version__
    assert report["config"]["prompts"] == 3 and report["config"]["models"]["drafter"].endswith("drafter")
    for r in rows:
        assert ROW_FIELDS <= set(r), r["label"]
        assert r["matches_ar"] and r["tokens_per_s"]["min"] <= r["tokens_per_s"]["median"] <= r["tokens_per_s"]["max"]
        assert len(r["tokens_per_s"]["runs"]) == 2 and r["memory"]["peak_rss_mb"] > 0
        assert r["new_tokens"] == 30 and r["calls"]["target"] >= 1
    assert torch.get_num_threads() == 1  # restored


def test_self_drafting_accepts_every_draft_token(self_drafted):
    _, _, report = self_drafted
    for r in report["rows"]:
        if r["method"] in ("spec-ar", "hf-assisted"):
            assert r["alpha"] == 1.0 and r["tau"] > 2 and r["calls"]["drafter"] > 0, r["label"]
    lookup = [r for r in report["rows"] if r["method"] == "hf-prompt-lookup"]
    assert all(r["calls"]["drafter"] == 0 and r["ideal"]["c_d"] == 0 for r in lookup)


@pytest.mark.parametrize("label", ["spec-ar g=3", "specdiff g=3 T=2 l2r"])
def test_call_log_acceptance_equals_the_loops_own_metrics(self_drafted, label):
    models, settings, report = self_drafted
    row = next(r for r in report["rows"] if r["label"] == label)
    drafter = models.ar_drafter if row["method"] == "spec-ar" else models.drafter
    m = generate(PROMPTS, target=models.target, drafter=drafter, method=row["method"], gamma=row["gamma"],
                 steps=row["steps"], schedule=row["schedule"], max_new_tokens=settings.max_new_tokens).metrics
    d = m.to_dict()
    assert row["iterations"] == m.iterations and row["tau"] == d["tau"] and row["alpha"] == d["alpha"]
    assert row["per_position_acceptance"] == d["per_position_acceptance"]
    assert row["accepted_length_histogram"][: len(d["accepted_length_histogram"])] == d["accepted_length_histogram"]
    assert row["calls"]["target"] == m.target_calls and row["calls"]["drafter"] == m.drafter_calls


def test_ideal_speedup_model(self_drafted):
    _, _, report = self_drafted
    ar = report["rows"][0]
    assert ar["ideal"]["speedup"] == pytest.approx(1.0) and ar["speedup"] == 1.0
    for r in report["rows"]:
        i = r["ideal"]
        assert i["c_1"] == ar["call_cost_s"]["verify"] and i["c_v"] == r["call_cost_s"]["verify"]
        assert i["speedup"] == pytest.approx(r["tau"] * i["c_1"] / (i["c_v"] + i["n_d"] * i["c_d"]))
        assert i["measured_over_ideal"] == pytest.approx(r["speedup"] / i["speedup"])
    t2 = next(r for r in report["rows"] if r["label"] == "specdiff g=3 T=2 l2r")
    assert 1 < t2["calls"]["drafter_per_iteration"] <= 2  # T drafter calls per draft, fewer at the end


def test_check_catches_a_wrong_acceptance_rule(tiny, broken_rule):
    models, _ = load_models(target=str(tiny.gpt2), drafter=str(tiny.drafter))
    report = run(models, PROMPTS, variants(["specdiff"], gammas=(3,)),
                 Settings(max_new_tokens=8, repeats=1, warmup=0, acceptance="accept-all", threads=1))
    assert report["check"]["passed"] is False and report["check"]["mismatched"] == ["specdiff g=3 T=3 l2r"]
    bad = report["rows"][1]["mismatches"][0]
    assert bad["ar"] != bad["got"] and report["rows"][0]["matches_ar"]


def _cli(tiny, tmp_path, *extra, models=None, env=None):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    models = models or ("--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--ar-drafter", str(tiny.ar))
    args = ["bench", *models, "--prompt-file", str(prompts), "--max-new-tokens", "8", "--repeats", "1", "--warmup", "0",
            "--threads", "1", "--out", str(tmp_path / "out"), *extra]
    return CliRunner().invoke(cli, args, env=env)


def test_cli_writes_table_json_plots_and_a_summary_line(tiny, tmp_path):
    result = _cli(tiny, tmp_path, "--gamma", "2,3", "--steps", "1,2", "--check")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["method", "tok/s", "speed-up"]  # one round: no [min, max] to show
    summary = json.loads(lines[-1])
    assert summary["check"] is True and summary["threads"] == 1 and "specdiff g=3 T=2 l2r" in summary["speedup"]
    out = tmp_path / "out"
    report = json.loads((out / "bench.json").read_text())
    assert {r["method"] for r in report["rows"]} == set(METHODS) - {"dflash", "eagle3"}  # theirs: dflash's test below
    assert all(ROW_FIELDS <= set(r) for r in report["rows"])
    for name in ("speedup", "accepted_lengths", "acceptance_by_position", "tokens_per_s_vs_gamma",
                 "tokens_per_s_vs_steps"):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, name


def test_cli_without_matplotlib_skips_the_plots_with_a_note(tiny, tmp_path, monkeypatch):
    for module in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, module, None)  # import matplotlib now fails
    result = _cli(tiny, tmp_path, "--methods", "ar,specdiff", "--gamma", "2")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("specdiff: note: plots need matplotlib: pip install 'matplotlib")
    assert "skipping the plots" in result.stderr and "Traceback" not in result.output
    assert result.stdout.startswith("method") and json.loads(result.stdout.strip().splitlines()[-1])["check"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.json"]
    quiet = _cli(tiny, tmp_path, "--methods", "ar", "--no-plots")
    assert quiet.exit_code == 0 and "note" not in quiet.stderr


def test_cli_check_exits_1_on_a_mismatch(tiny, tmp_path, broken_rule):
    result = _cli(tiny, tmp_path, "--methods", "specdiff", "--gamma", "3", "--acceptance", "accept-all",
                  "--check", "--no-plots")
    assert result.exit_code == 1
    assert "MISMATCH: specdiff g=3 T=3 l2r" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("specdiff: error: greedy outputs differ from ar")
    assert json.loads(result.stdout.strip().splitlines()[-1])["check"] is False
    assert not (tmp_path / "out" / "speedup.png").exists()


@pytest.mark.parametrize("extra, message", [
    (("--methods", "ar,spec-ar"), "method 'spec-ar' needs an autoregressive drafter (--ar-drafter)"),
    (("--methods", "ar,nope"), "unknown method 'nope'"),
    (("--gamma", "2,x"), "comma-separated list of integers or auto, got '2,x'"),
    (("--acceptance", "bogus"), "unknown acceptance rule 'bogus' (choose from "),  # once dropped silently
    (("--methods", "ar,specdiff", "--acceptance", "multi"), "acceptance rule 'multi' fits none of the rows"),
    (("--methods", "ar", "--acceptance", "greedy"), "acceptance rule 'greedy' fits none of the rows"),
])
def test_cli_usage_errors_are_one_line(tiny, tmp_path, extra, message):
    result = _cli(tiny, tmp_path, *extra, "--no-plots", models=("--target", str(tiny.gpt2)))
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


LISTS = {"--methods": "ar,specdiff,specdiff", "--gamma": "auto,4,auto", "--steps": "2,2", "--schedule": "l2r,l2r",
         "--drafts": "1,2,01", "--acceptance": "greedy,greedy", "--temperature": "0,0.0", "--batch-size": "1,4,1"}


@pytest.mark.parametrize("flag", LISTS)
def test_a_value_listed_twice_is_refused_in_every_list(tiny, tmp_path, flag):
    """`--gamma 4,4` made two rows of one label and the JSON summary kept one: every list option
    refuses a value it lists twice (as parsed: 1 and 01, 0 and 0.0), before any model loads; so
    does variants() for the library."""
    result = _cli(tiny, tmp_path, flag, LISTS[flag], "--no-plots", models=("--target", "no-such-model"))
    assert result.exit_code == 2, result.stderr
    assert "is listed twice (each value is one row): give it once" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    lists = {"methods": ["ar", "specdiff", "ar"], "gammas": [4, 4], "steps": [2, 2], "schedules": ["l2r", "l2r"],
             "drafts": [1, 1], "rules": ["greedy", "greedy"], "temperatures": [0, 0.0], "batch_sizes": [1, 1]}
    for name, values in lists.items():
        with pytest.raises(UsageError, match=f"^`{name}` lists .* twice: each value is one row; give it once$"):
            variants(**{"methods": ["ar", "specdiff"], name: values})
    with pytest.raises(UsageError, match="^two rows would both be 'ar t=0.7': give values that differ in what"):
        variants(["ar"], temperatures=[0.7, 0.7000001])  # distinct values, one label


def test_shipped_prompt_sets_parse_and_are_the_default(tiny, tmp_path):
    from specdiff.tools.bench import DEFAULT_PROMPTS
    from specdiff_cli.prompts import parse_prompts

    heldout = parse_prompts(DEFAULT_PROMPTS.read_text(encoding="utf-8"), "auto", "heldout")
    faq_file = Path(__file__).resolve().parents[1] / "prompts" / "python-faq.txt"
    faq = parse_prompts(faq_file.read_text(encoding="utf-8"), "auto", "faq")
    assert len(heldout) == 32 and all(r.fields["source"] for r in heldout)
    assert {r.fields["source"].split(":")[0] for r in heldout} == {"shakespeare", "web", "python3.11-doc"}
    assert len(faq) == 176 and all(r.prompt.endswith("?") for r in faq)
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny.gpt2), "--methods", "ar", "--num-prompts", "2",
                                      "--truncate-prompt", "--max-new-tokens", "4", "--repeats", "1", "--warmup", "0",
                                      "--threads", "1", "--no-plots", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["prompts"] == 2


def test_timed_passes_are_round_robin_and_speedups_paired(tiny, monkeypatch):
    """Pass i of every variant runs before pass i + 1 of any (a slow spell hits all methods), and a
    speed-up is the median over rounds of the variant's tokens/s over ar's in the same round."""
    from specdiff.tools.bench import measure
    from specdiff.tools.bench.passes import Pass

    order, seconds = [], {"ar": [1.0, 3.0, 1.5], "spec-ar": [0.5, 3.0, 3.0]}  # per timed pass

    def fake_pass(models, v, s):
        def one_pass(prompts, encoded):
            order.append(v.method)
            timed = len([m for m in order if m == v.method]) - s.warmup
            yield [1, 2, 3], seconds[v.method][timed - 1] if timed > 0 else 1.0, None
        return Pass(one_pass)

    monkeypatch.setattr(measure, "PASSES", {"ar": fake_pass, "spec-ar": fake_pass})
    models, _ = load_models(target=str(tiny.gpt2), ar_drafter=str(tiny.ar))
    report = run(models, PROMPTS[:1], variants(["spec-ar"], gammas=(2,)), Settings(repeats=3, warmup=1, threads=1))
    assert order == ["ar", "spec-ar"] * 4
    row = report["rows"][1]
    # tokens/s: ar 3, 1, 2; spec-ar 6, 1, 1 -> ratios 2, 1, 0.5 (unpaired medians would give 1 / 2)
    assert row["speedup"] == pytest.approx(1.0) and row["speedup_range"] == pytest.approx([0.5, 2.0])


def test_pair_names_its_ar_drafter(tiny, tmp_path):
    """spec-ar / hf-assisted in the methods load the pair's `ar_drafter:`; --ar-drafter still wins."""
    path = tmp_path / "models.yaml"
    path.write_text(f"""models:
  - {{name: t, kind: target, path: {tiny.gpt2}}}
  - {{name: small, kind: target, path: {tiny.ar}}}
  - {{name: d, kind: drafter, path: {tiny.drafter}}}
  - {{name: t+d, kind: pair, target: t, drafter: d, ar_drafter: small}}
""")
    reg = load_registry(path)
    models, _ = load_models(pair="t+d", methods=["spec-ar"], registry=reg)
    assert models.ar_drafter.source == "small" and models.drafter is not None
    assert load_models(pair="t+d", methods=["ar", "specdiff"], registry=reg)[0].ar_drafter is None  # not needed
    given, _ = load_models(pair="t+d", ar_drafter=str(tiny.gpt2), methods=["hf-assisted"], registry=reg)
    assert given.ar_drafter.source == str(tiny.gpt2)
    result = _cli(tiny, tmp_path, "--methods", "spec-ar,hf-assisted", "--gamma", "2", "--no-plots", "--check",
                  models=("--pair", "t+d"), env={"SPECDIFF_MODELS": str(path)})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert [r["method"] for r in report["rows"]] == ["ar", "spec-ar", "hf-assisted"]


def test_rows_carry_their_calls_over_the_measured_floor(self_drafted):
    """x floor = the verify (ar: decode) call's cost over max(weights / bandwidth, flops / peak) at
    its width; the peaks are measured in the run and the floors follow from them."""
    models, _, report = self_drafted
    roof = report["roofline"]
    assert roof["read_gb_s"] > 0 and roof["gflop_s"] > 0
    assert roof["params"] == sum(p.numel() for p in {p.data_ptr(): p for p in models.target.model.parameters()}.values()
                                 if p.data_ptr() != models.target.model.transformer.wte.weight.data_ptr()
                                 or models.target.model.config.tie_word_embeddings)
    floor = lambda w: max(roof["weight_bytes"] / (roof["read_gb_s"] * 1e9), 2 * roof["params"] * w / (roof["gflop_s"] * 1e9))  # noqa: E731
    assert roof["floor_ms"][9] == pytest.approx(floor(9) * 1e3, abs=0.01)
    for r in report["rows"]:
        width = 1 + sum(g * n for g, n in enumerate(r["draft_length_histogram"])) / max(1, sum(r["draft_length_histogram"]))
        assert r["roofline"]["width"] == pytest.approx(width, abs=0.01)
        assert r["roofline"]["x_floor"] == pytest.approx(r["call_cost_s"]["verify"] / floor(round(width)), rel=0.01)
    assert next(r for r in report["rows"] if r["label"] == "ar")["roofline"]["width"] == 1


def test_a_small_models_floor_line_keeps_its_figures(self_drafted):
    """The tiny target's floor was printed as "0 MB of weights ... 1 tokens 0.0 ms" and stored as
    0.0 ms: its figures keep 3 significant digits, each in a unit that holds them."""
    from specdiff.tools.bench_output import format_table

    _, _, report = self_drafted
    assert all(ms > 0 for ms in report["roofline"]["floor_ms"].values())
    line = next(x for x in format_table(report).splitlines() if x.startswith("x floor:"))
    assert re.search(r": [1-9][\d.]* kB of weights at [1-9][\d.]* [kMGT]?B/s, [1-9][\d.]* [MGT]?FLOP/s measured -> "
                     r"1 tokens [1-9][\d.]* (ns|us|ms|s), 5 tokens", line), line


class WidthDependent:
    """A broken control: a target whose multi-token calls' logits are those of another arithmetic
    (noise of 0.5 on every logit), as low-precision kernels' are."""

    def __init__(self, target):
        self.target, self.device = target, target.device

    def __getattr__(self, name):
        return getattr(self.target, name)

    def extend(self, ids, new=None):
        logits = self.target.extend(ids, new)
        return logits + 0.5 * torch.randn_like(logits) if ids.shape[1] > 1 else logits


def test_width_invariance_is_measured_per_runtime_and_catches_a_width_dependent_target(self_drafted):
    models, _, report = self_drafted
    torch_run = report["width_invariance"]["torch"]
    assert torch_run["gap"] < 1e-4 and torch_run["margin"] > 0 and not torch_run["flip"]
    assert all(r["width_invariance"] == torch_run for r in report["rows"] if r["runtime"] == "torch")
    ids = models.target.tokenizer.encode(PROMPTS[0] * 3)
    again = width_invariance(models.target, ids)
    assert again["gap"] < 1e-4 and not again["flip"] and again["widths"] == [5, 9]
    broken = width_invariance(WidthDependent(models.target), ids)
    assert broken["gap"] > 0.5 and broken["flip"]


def test_unreliable_speedups_are_named_with_their_reasons():
    """Synthetic per-round tokens/s: a steady row passes; ar's or the row's own spread above the
    limit, or per-round speed-ups on both sides of 1.0, each give their reason; one round none."""
    from specdiff.tools.bench import SPREAD_LIMIT, unreliable

    assert unreliable([100, 105, 110], [50, 52, 51], [1.9, 2.1]) == []
    assert unreliable([100, 125, 150], [50, 52, 51], [1.9, 2.1]) == []  # (150 - 100) / 125 = 0.4
    assert SPREAD_LIMIT == 0.5
    assert unreliable([95, 100, 101], [12.2, 20.0, 32.9], [2.9, 7.8]) == [
        "ar's tokens/s varied by 103% of the median across rounds (limit 50%)"]  # the bogus 5.8x
    assert unreliable([60, 100, 130], [90, 92, 91], [0.7, 1.4]) == [
        "its tokens/s varied by 70% of the median across rounds (limit 50%)",
        "its per-round speed-ups [0.70, 1.40] lie on both sides of 1.0"]
    assert unreliable([100, 110, 104], [100, 101, 102], [0.98, 1.08]) == [
        "its per-round speed-ups [0.98, 1.08] lie on both sides of 1.0"]
    assert unreliable([100], [10], [10.0, 10.0]) == []  # one round: no spread to judge


def test_cli_warns_when_rounds_disagree(tiny, tmp_path, monkeypatch):
    """Fake passes (as in the round-robin test): ar's rounds take 1, 3 and 1.5 s, so every
    speed-up over it is unreliable; the warning, its advice and bench.json say so."""
    from specdiff.tools.bench import measure
    from specdiff.tools.bench.passes import Pass

    seconds = {"ar": [1.0, 3.0, 1.5], "spec-ar": [0.5, 0.5, 0.5]}

    def fake_pass(models, v, s):
        done = []

        def one_pass(prompts, encoded):
            done.append(1)
            yield [1, 2, 3], seconds[v.method][len(done) - 1], None
        return Pass(one_pass)

    monkeypatch.setattr(measure, "PASSES", {"ar": fake_pass, "spec-ar": fake_pass})
    result = _cli(tiny, tmp_path, "--methods", "spec-ar", "--gamma", "2", "--repeats", "3", "--no-plots")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("specdiff: warning:")
                and "other processes kept" not in line]  # this machine's load: the test below
    assert warnings == [
        "specdiff: warning: spec-ar g=2: speed-up 3.00x is unreliable: ar's tokens/s varied by 100% of the "
        "median across rounds (limit 50%)",
        "specdiff: warning: for a reliable speed-up: more --repeats, fewer --threads, or a quiet machine"]
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert report["reliability"]["unreliable"] == ["spec-ar g=2"] and report["rows"][0]["unreliable"] == []
    assert json.loads(result.stdout.strip().splitlines()[-1])["unreliable"] == ["spec-ar g=2"]


def rows_with_rounds(**runs: list[float]) -> list[dict]:
    return [{"label": label.replace("_", " "), "speedup_runs": r} for label, r in runs.items()]


def test_best_is_named_only_when_it_was_the_fastest_in_every_round():
    from specdiff.tools.bench_output import best_row

    assert best_row(rows_with_rounds(ar=[1, 1, 1], specdiff=[1.2, 1.1, 1.3])) == (
        "specdiff", "faster than every other row in each of the 3 rounds")
    assert best_row(rows_with_rounds(ar=[1, 1, 1], specdiff=[1.2, 0.9, 1.3], ar_onnx=[1.1, 1.5, 1.2])) == (
        None, "no row was the fastest in every round (round 1: specdiff; round 2: ar onnx; round 3: specdiff)")
    assert best_row(rows_with_rounds(ar=[1, 1], specdiff=[0.8, 0.7])) == (
        "ar", "faster than every other row in each of the 2 rounds")  # plain decoding is the best
    assert best_row(rows_with_rounds(ar=[1.0], ar_t=[1.0]))[0] is None  # a tie names none
    assert best_row(rows_with_rounds(ar=[1.0], specdiff=[1.1])) == (
        "specdiff", "the fastest row in the one round (repeats 1: no spread to judge it by)")


def test_foreign_cpu_load_is_the_machines_busy_time_less_benchs_own_over_the_wall_time(monkeypatch):
    from types import SimpleNamespace

    from specdiff.tools.bench import measure

    busy, own, clock = iter([100.0, 103.0]), iter([5.0, 6.0]), iter([10.0, 12.0])
    monkeypatch.setattr(measure, "_busy_s", lambda: next(busy))
    monkeypatch.setattr(measure, "_own_cpu_s", lambda: next(own))
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    with measure.CpuLoad() as load:
        pass
    assert load.cores == 1.0  # (3 s busy - 1 s its own) / 2 s
    clock, own = iter([10.0, 12.0]), iter([5.0, 6.0])
    monkeypatch.setattr(measure, "_busy_s", lambda: None)  # no /proc/stat, no psutil
    with measure.CpuLoad() as unknown:
        pass
    assert unknown.cores is None
    monkeypatch.undo()
    assert measure._busy_s() is not None or not Path("/proc/stat").exists()


class BusyMachine:
    """CpuLoad as if other processes had kept 1.2 cores busy."""

    def __enter__(self):
        self.cores = 1.2
        return self

    def __exit__(self, *exc):
        return None


def test_cli_says_when_the_run_cannot_show_its_spread_or_the_machine_was_busy(tiny, tmp_path, monkeypatch):
    """--repeats 1: a warning (no spread to see); other processes busy: a warning and bench.json's
    environment.foreign_cpu_load; --warmup 0: no warm-up lines."""
    import specdiff.tools.bench as lib

    monkeypatch.setattr(lib, "CpuLoad", BusyMachine)
    result = _cli(tiny, tmp_path, "--methods", "ar", "--no-plots")  # --repeats 1 --warmup 0
    assert result.exit_code == 0, result.output
    assert "warm-up" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("specdiff: warning:")]
    assert warnings == [
        "specdiff: warning: --repeats 1: one timed pass per row, so nothing shows how much its speed varies from "
        "pass to pass; --repeats 3 or more shows the spread",
        f"specdiff: warning: other processes kept 1.20 CPU cores busy (of {os.cpu_count()}) while bench timed: its "
        "speeds are lower and noisier than on a quiet machine"]
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert report["environment"]["foreign_cpu_load"] == 1.2
    assert json.loads(result.stdout.strip().splitlines()[-1])["foreign_cpu_load"] == 1.2
    assert report["prompt_texts"] == PROMPTS and len(report["rows"][0]["texts"]) == len(PROMPTS)
    quiet = _cli(tiny, tmp_path, "--methods", "ar", "--no-plots", "--repeats", "2", "--warmup", "1")
    assert "--repeats 1" not in quiet.stderr and "bench: warm-up ar" in quiet.stderr


def test_batch_sizes_are_swept_with_throughput_per_row_and_kv_peak(tiny):
    models, _ = load_models(target=str(tiny.gpt2), drafter=str(tiny.drafter), ar_drafter=str(tiny.ar))
    rows = variants(["ar", "specdiff", "hf-prompt-lookup"], gammas=(3,), steps=(1,), batch_sizes=(1, 3))
    report = run(models, PROMPTS, rows, Settings(max_new_tokens=8, repeats=1, warmup=0, threads=1))
    by = {r["label"]: r for r in report["rows"]}
    assert list(by) == ["ar", "ar b=3", "specdiff g=3 T=1 l2r", "specdiff g=3 T=1 l2r b=3", "hf-prompt-lookup g=3"]
    assert report["check"]["passed"] and all(r["new_tokens"] == 24 for r in by.values())
    one, three = by["specdiff g=3 T=1 l2r"], by["specdiff g=3 T=1 l2r b=3"]
    assert (one["tau"], one["alpha"], one["iterations"]) == (three["tau"], three["alpha"], three["iterations"])
    assert three["tokens_per_s_per_row"] == pytest.approx(three["tokens_per_s"]["median"] / 3)
    assert three["memory"]["kv_cache_peak_mb"] > one["memory"]["kv_cache_peak_mb"] > 0
    assert by["hf-prompt-lookup g=3"]["memory"]["kv_cache_peak_mb"] is None  # transformers keeps its own


def test_bench_refuses_a_batch_size_below_1(tiny):
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny.gpt2), "--methods", "ar", "--batch-size", "1,0",
                                      "--no-plots", "--num-prompts", "1"])
    assert result.exit_code == 2 and result.stderr == "specdiff: error: batch_size values must be >= 1, got 1, 0\n"


def test_cli_sweeps_drafts_rules_and_temperatures_into_one_report(tiny, tmp_path):
    """--drafts 1,2 --acceptance select,multi --temperature 0,1: each rule on the rows it fits
    (multi needs K > 1), an ar reference per temperature, the greedy check on the t=0 rows only."""
    result = _cli(tiny, tmp_path, "--methods", "specdiff", "--gamma", "3", "--steps", "1", "--drafts", "1,2",
                  "--acceptance", "select,multi", "--temperature", "0,1", "--top-p", "0.9", "--no-plots")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    assert list(rows) == ["ar t=0", "ar t=1"] + [f"specdiff g=3 T=1 l2r {k} t={t}" for t in (0, 1)
                                                  for k in ("K=1 select", "K=2 select", "K=2 multi")]
    assert report["check"] == {"greedy": True, "passed": True, "mismatched": []}
    assert all(rows[f"specdiff g=3 T=1 l2r K=2 {r} t=0"]["matches_ar"] for r in ("select", "multi"))
    assert rows["specdiff g=3 T=1 l2r K=2 multi t=1"]["matches_ar"] is None
    assert report["config"]["top_p"] == 0.9 and all(r["tau"] >= 1 for r in rows.values())


def test_cli_sweeps_gamma_auto_beside_fixed_gammas_over_batch_sizes_and_temperatures(tiny, tmp_path):
    """Issue 24: --gamma auto,2 --batch-size 1,2 --temperature 0,1: auto and each fixed gamma at
    every batch size and temperature (dflash and the peers take no auto), the greedy check on the
    auto rows too, the chosen lengths and cost table in bench.json, the tokens/s by batch size plot."""
    result = _cli(tiny, tmp_path, "--methods", "spec-ar,specdiff", "--gamma", "auto,2", "--steps", "1",
                  "--batch-size", "1,2", "--temperature", "0,1", "--check")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    expected = [f"{m} t={t}{b}" for t in (0, 1) for m in ("ar", *(f"{method} g={g}{tail}" for method, tail in
                (("spec-ar", ""), ("specdiff", " T=1 l2r")) for g in ("auto", 2))) for b in ("", " b=2")]
    assert sorted(rows) == sorted(expected) and report["check"]["passed"] is True
    for label, r in rows.items():
        assert sum(r["draft_length_histogram"]) == r["iterations"]
        assert (r["draft_costs"] is not None) == ("g=auto" in label)  # the table auto chose by, nowhere else
        if "g=auto" in label:  # the cap: the drafter's gamma, else 8 (w = 1..9)
            assert len(r["draft_costs"]["verify_s"][0]) == 9 and r["draft_costs"]["rows"][-1] == r["batch_size"]
    assert (tmp_path / "out" / "tokens_per_s_vs_batch_size.png").read_bytes().startswith(PNG)


def test_drafts_and_batch_sizes_combine():
    """Each K row runs at each batch size (the batched loop serves self-selection too)."""
    rows = variants(["specdiff"], gammas=(3,), steps=(1,), drafts=(1, 2), batch_sizes=(1, 3))
    base = "specdiff g=3 T=1 l2r"
    assert [v.label for v in rows] == ["ar", "ar b=3", f"{base} K=1", f"{base} K=1 b=3", f"{base} K=2", f"{base} K=2 b=3"]


def test_bench_refuses_drafts_past_free_memory_before_timing(tiny, tmp_path):
    """bench --drafts had no upper bound either: every variant's plan is checked before the first pass."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\nThe sea\n")
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter),
                                      "--methods", "ar,specdiff", "--drafts", "1,100000000", "--prompt-file",
                                      str(prompts), "--max-new-tokens", "4", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "--drafts 100000000" in result.stderr and "GB free" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_table_shows_a_spread_only_over_several_rounds(tiny, tmp_path):
    """[min, max] of tokens/s is a column when there were rounds to differ (it showed one round's
    figure twice)."""
    result = _cli(tiny, tmp_path, "--methods", "ar,specdiff", "--repeats", "2")
    assert result.exit_code == 0, result.output
    head, _, *rows = result.stdout.strip().splitlines()[:-1]
    assert head.split()[:3] == ["method", "tok/s", "[min,"]
    low, high = (float(x) for x in rows[0].split("[")[1].split("]")[0].split(","))
    assert low <= float(rows[0].split()[1]) <= high


def test_drafters_of_two_kinds_in_one_run_each_draft_their_own_rows(tiny, tmp_path):
    """--also-drafter: a DFlash drafter and an EAGLE-3 head over one target, each method's rows
    drafted by the drafter of its kind (tau as in a run with that drafter alone), both checked
    against ar; a second drafter of a kind already loaded, or an AR drafter, is one UsageError."""
    from tiny import make_dflash, make_eagle3

    dflash, eagle3 = make_dflash(tmp_path / "dflash", tiny.gpt2), make_eagle3(tmp_path / "eagle3", tiny.gpt2, scale=10)
    models, _ = load_models(target=str(tiny.gpt2), drafter=str(dflash), others=[str(eagle3)])
    assert {"dflash", "eagle3"} <= set(available_methods(models))
    settings = Settings(max_new_tokens=8, repeats=1, warmup=0, threads=1)
    both = run(models, PROMPTS[:2], variants(["dflash", "eagle3"], gammas=(3,)), settings)
    assert [r["label"] for r in both["rows"]] == ["ar", "dflash g=3", "eagle3 g=3"] and both["check"]["passed"]
    assert both["config"]["models"]["others"] == [models.others[0].source]
    for row in both["rows"][1:]:  # each kind's calls logged: an EAGLE-3 head's extend / step / logits, never forward
        assert row["time_s"]["draft"] > 0 and row["call_cost_s"]["drafter"] is not None and row["ideal"], row["label"]
    assert both["rows"][2]["calls"]["drafter_per_iteration"] >= 3  # gamma 3: a head call for each draft token
    assert not {"extend", "step", "logits"} & set(vars(models.others[0]))  # the timing wrappers removed
    alone, _ = load_models(target=str(tiny.gpt2), drafter=str(eagle3))
    head = run(alone, PROMPTS[:2], variants(["eagle3"], gammas=(3,)), settings)["rows"][1]
    assert head["tau"] == both["rows"][2]["tau"] and head["alpha"] == both["rows"][2]["alpha"]
    for other, said in ((dflash, "a DFlash drafter, a kind already loaded"), (tiny.ar, r"an autoregressive .* drafter: "
                                                                            "that one is the `ar_drafter`")):
        with pytest.raises(UsageError, match=f"also-drafter '.*' is {said}"):
            load_models(target=str(tiny.gpt2), drafter=str(dflash), others=[str(other)])


def test_an_empty_also_drafter_is_refused_before_any_model_loads(tiny, tmp_path, monkeypatch):
    """--also-drafter '' was read as the current directory ("." : no model here), after the target loaded."""
    monkeypatch.setattr("specdiff.tools.bench.config.load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n")
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny.gpt2), "--also-drafter", "", "--prompt-file",
                                      str(prompts), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr == \
        "specdiff: error: --also-drafter is empty: give a models.yaml name, a directory or a hub id\n"


@pytest.mark.parametrize("dflash_layers", [(0, 1), (0, 1, 1)])
def test_drafters_reading_other_layers_are_refused_before_any_export(tiny, tmp_path, monkeypatch, dflash_layers):
    """--runtime onnxruntime drafts every drafter over one target graph: a DFlash drafter and an
    EAGLE-3 head reading other target layers were refused only after both exports (minutes each),
    with the advice to export the target with each drafter, as bench had just done."""
    from specdiff.exporters import cache
    from tiny import make_dflash, make_eagle3

    def exported(*args, **kwargs):
        raise UsageError("an export began")

    monkeypatch.setattr(cache, "export_for", exported)
    dflash = make_dflash(tmp_path / "dflash", tiny.gpt2, target_layer_ids=dflash_layers)
    eagle3 = make_eagle3(tmp_path / "eagle3", tiny.gpt2, layer_ids=(0, 1, 1))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n")
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny.gpt2), "--drafter", str(dflash), "--also-drafter",
                                      str(eagle3), "--methods", "ar,dflash,eagle3", "--runtime", "onnxruntime",
                                      "--prompt-file", str(prompts), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    if dflash_layers == (0, 1, 1):  # the same layers: on to the exports
        assert "an export began" in result.stderr
        return
    assert f"'{dflash}' reads [1, 2], '{eagle3}' reads [1, 2, 2]: bench each of them in a run of its own" \
        in result.stderr


def test_dflash_is_benched_with_a_dflash_drafter_and_refused_with_another(tiny, tmp_path):
    """One drafter slot: dflash runs where it holds a DFlash drafter (greedy, checked against ar),
    and a dflash row beside a diffusion drafter is one UsageError naming the kind it needs."""
    from tiny import make_dflash

    drafter = make_dflash(tmp_path / "dflash", tiny.gpt2)
    models, _ = load_models(target=str(tiny.gpt2), drafter=str(drafter))
    assert available_methods(models) == ["ar", "dflash", "hf-prompt-lookup"]
    report = run(models, PROMPTS[:2], variants(["dflash"], gammas=(3,), trees=(0, 4)),
                 Settings(max_new_tokens=8, repeats=1, warmup=0, threads=1))
    assert [r["label"] for r in report["rows"]] == ["ar", "dflash g=3", "dflash g=3 tree=4"] and report["check"]["passed"]
    chain, tree = report["rows"][1:]
    sizes = tree["tree_size_histogram"]  # nodes per verified tree: its verify width is 1 + that
    assert chain["tree_size_histogram"] is None and sum(sizes) == tree["iterations"] and len(sizes) <= 5
    assert tree["roofline"]["width"] == pytest.approx(1 + sum(n * c for n, c in enumerate(sizes)) / sum(sizes), abs=0.01)
    auto = run(models, PROMPTS[:2], variants(["dflash"], gammas=("auto",)), Settings(max_new_tokens=8, repeats=1,
                                                                                     warmup=0, threads=1))
    row = auto["rows"][1]  # its cost table timed before the pass: its dummy calls are not read as steps
    assert row["label"] == "dflash g=auto" and row["draft_costs"] is not None and auto["check"]["passed"]
    assert row["calls"]["target_prefill"] == 2 and len(row["accepted_length_histogram"]) <= 8  # gamma <= 7
    assert sum(row["draft_length_histogram"]) == row["iterations"]
    diffusion, _ = load_models(target=str(tiny.gpt2), drafter=str(tiny.drafter))
    assert "dflash" not in available_methods(diffusion)
    with pytest.raises(UsageError, match="method 'dflash' needs a DFlash drafter"):
        run(diffusion, PROMPTS[:1], variants(["dflash"], gammas=(3,)), Settings(max_new_tokens=4, repeats=1, warmup=0))
