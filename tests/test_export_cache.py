"""The ONNX export cache (`--runtime onnxruntime` without `--artifacts`) repairs what it holds as
the GGUF cache does: an entry that does not open (no manifest.json, its tokenizer folder gone, a
file for the directory) is removed and exported again, once, with one stderr line; one that
cannot be removed or written is one LoadError naming the cache and the fix; what an export killed
by kill -9 left is removed by the next run."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import specdiff.atomic
import specdiff.exporters.cache
import specdiff.gguf
from specdiff.artifacts import open_artifacts
from specdiff.atomic import check_new_directory, new_directory
from specdiff.errors import LoadError
from specdiff.exporters.cache import cached_export
from specdiff.registry import as_registry
from specdiff_cli.main import cli

pytest.importorskip("onnxruntime")
pytest_plugins = ["exported"]  # onnx_pair: tiny.gpt2 + tiny.drafter, exported once per session


def copy_of(source: Path):
    """An `export` that writes a copy of the export `source` as export writes (check_new_directory,
    then new_directory): a second real export would take 10-20 s per test."""
    def export(out: Path, **options: object) -> Path:
        check_new_directory(out)
        with new_directory(out) as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        return out

    return export


@pytest.fixture
def entry(tiny, onnx_pair, tmp_path, monkeypatch) -> Path:
    """A cache holding onnx_pair as the entry of tiny.gpt2 and tiny.drafter; exports copy onnx_pair."""
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(specdiff.exporters.cache, "export", copy_of(onnx_pair))
    out = cached(tiny)
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    return out


def cached(tiny) -> Path:
    return cached_export(str(tiny.gpt2), str(tiny.drafter), as_registry(None))


def replace_entry_by_file(out: Path) -> None:
    shutil.rmtree(out)
    out.write_text("not a directory")


DAMAGES = {"no manifest.json": lambda out: (out / "manifest.json").unlink(),
           "no tokenizer folder": lambda out: shutil.rmtree(out / "tokenizer"),
           "a file for the entry": replace_entry_by_file}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_entry_is_exported_again_once(damage, entry, tiny, capsys):
    """Before, an entry without manifest.json failed every run ("exporting ..." then "... exists and
    is not an empty directory"), one without its tokenizer folder was an HFValidationError traceback."""
    capsys.readouterr()
    DAMAGES[damage](entry)
    assert cached(tiny) == entry
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"specdiff: the cached export {entry} does not open (")
    assert err[0].endswith("; exporting it again") and err[1].startswith("specdiff: exporting")
    open_artifacts(entry)
    cached(tiny)
    assert capsys.readouterr().err == ""  # repaired for good
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no leftovers


def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def test_a_damaged_entry_in_a_read_only_cache_is_one_line(entry, tiny, monkeypatch, capsys):
    """Before, it said "exporting it again", removed nothing and failed as the entry above."""
    capsys.readouterr()
    (entry / "manifest.json").unlink()
    monkeypatch.setattr(specdiff.gguf, "remove", read_only)
    with pytest.raises(LoadError, match=f"specdiff's cache entry {entry} is not usable .* cannot be removed "
                                        r"\(Read-only file system\): delete it, or set SPECDIFF_CACHE"):
        cached(tiny)
    assert capsys.readouterr().err == ""


def test_an_entry_that_cannot_be_written_is_one_line_naming_the_cache(entry, tiny, monkeypatch):
    shutil.rmtree(entry)
    monkeypatch.setattr(specdiff.atomic, "temp_directory", read_only)
    with pytest.raises(LoadError, match=rf"cannot write the export of '{tiny.gpt2}' and '{tiny.drafter}' to "
                                        rf"specdiff's cache \({entry}: Read-only file system\): make room there, "
                                        "or set SPECDIFF_CACHE"):
        cached(tiny)
    assert list(entry.parent.iterdir()) == []


@pytest.mark.slow  # two real exports, 20-40 s
def test_an_entry_without_manifest_is_exported_again_for_real(tiny, tmp_path, monkeypatch):
    """As above through `specdiff generate --runtime onnxruntime`, with the real export; its output is torch's."""
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    args = ["generate", "--target", str(tiny.gpt2), "--method", "ar", "--max-new-tokens", "8", "--prompt", "The sea"]
    want = CliRunner().invoke(cli, args)
    first = CliRunner().invoke(cli, [*args, "--runtime", "onnxruntime"])
    [entry] = (tmp_path / "cache" / "onnx").iterdir()
    (entry / "manifest.json").unlink()
    again = CliRunner().invoke(cli, [*args, "--runtime", "onnxruntime"])
    assert [r.exit_code for r in (want, first, again)] == [0, 0, 0], again.stderr
    assert first.stdout == again.stdout == want.stdout and "does not open" in again.stderr
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]


def test_a_killed_export_into_the_cache_is_removed_by_the_next_run(entry, tiny):
    """Killed (kill -9) while exporting into the cache: its hidden directory goes at the next run."""
    code = ("import time\nfrom pathlib import Path\nfrom specdiff.atomic import new_directory\n"
            f"with new_directory(Path({str(entry.parent / '0123456789abcdef')!r})) as tmp:\n"
            "    (tmp / 'target.onnx').write_bytes(bytes(1000))\n    print(tmp, flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    left = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert left.is_dir() and left.parent == entry.parent
    assert cached(tiny) == entry
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]
