"""specdiff's cache checks what it holds: a GGUF conversion whose files changed, went missing or
were never recorded is converted again, once, with one stderr line; one that cannot be written is
one LoadError naming the cache and the fix. Temporary directories carry their process's pid, and
those of killed processes are removed by the next run (atomic.remove_stale)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specdiff.atomic import host, new_directory, temp_directory, temp_path
from specdiff.errors import LoadError
from specdiff.loading import load_target
from specdiff.training.checkpoints import publish

pytest.importorskip("gguf")

REPAIRED = "is not usable"


@pytest.fixture(scope="module")
def converted(llama_gguf, tmp_path_factory) -> Path:
    """A cache holding the GGUF file's conversion, made once; tests damage copies of it."""
    pristine = tmp_path_factory.mktemp("pristine")
    os.environ["SPECDIFF_CACHE"] = str(pristine)
    try:
        load_target(str(llama_gguf[0]))
    finally:
        del os.environ["SPECDIFF_CACHE"]
    return pristine


@pytest.fixture
def entry(converted, tmp_path, monkeypatch) -> Path:
    """A copied cache (new inodes and ctimes: every file is hashed whole on its first check)."""
    shutil.copytree(converted, tmp_path / "cache")
    monkeypatch.setenv("SPECDIFF_CACHE", str(tmp_path / "cache"))
    [out] = [p for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.startswith(".")]
    return out


def overwrite_tensor(weights: Path, name: str, value: bytes) -> None:
    """Write `value` (one element's bytes) over every element of tensor `name`, in place."""
    with open(weights, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        begin, end = json.loads(f.read(size))[name]["data_offsets"]
        f.seek(8 + size + begin)
        f.write(value * ((end - begin) // len(value)))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def replace_by_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def replace_entry_by_file(out: Path) -> None:
    shutil.rmtree(out)
    out.write_text("not a directory")


V_PROJ = "model.layers.1.self_attn.v_proj.weight"
DAMAGES = {"a zeroed v_proj": lambda out: overwrite_tensor(out / "model.safetensors", V_PROJ, bytes(4)),
           "NaN weights": lambda out: overwrite_tensor(out / "model.safetensors", V_PROJ, b"\x00\x00\xc0\x7f"),
           "no weights": lambda out: (out / "model.safetensors").unlink(),
           "truncated weights": lambda out: truncate(out / "model.safetensors"),
           "truncated tokenizer": lambda out: truncate(out / "tokenizer.json"),
           "no config.json": lambda out: (out / "config.json").unlink(),
           "config.json a directory": lambda out: replace_by_directory(out / "config.json"),
           "a file for the entry": replace_entry_by_file,
           "an older specdiff's entry": lambda out: (out / "specdiff-cache.json").unlink()}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_entry_is_converted_again_once(damage, entry, llama_gguf, capsys):
    """Before, a zeroed tensor gave other text with exit 0, the rest failed on every run (or, with
    no config.json, reconverted for 20 s each time into `Directory not empty`)."""
    path, expected, _ = llama_gguf
    load_target(str(path))  # the copy is sound
    assert capsys.readouterr().err == ""
    DAMAGES[damage](entry)
    target = load_target(str(path))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and REPAIRED in err[0] and "specdiff's cache" in err[0] and "converting it again" in err[0]
    got = target.model.state_dict()
    assert all(torch.equal(got[name], tensor.float()) for name, tensor in expected.items())
    load_target(str(path))
    assert capsys.readouterr().err == ""  # repaired for good
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no leftovers


def test_a_sound_entry_is_not_hashed_whole(llama_gguf, entry, monkeypatch):
    """Untouched since written (or since its last full check): sizes, stat and the first MiB only."""
    import specdiff.gguf

    load_target(str(llama_gguf[0]))
    shutil.rmtree(entry.parent)
    load_target(str(llama_gguf[0]))  # converted here: its recorded stat is this file system's
    hashed, sha256_file = [], specdiff.gguf.sha256_file
    monkeypatch.setattr(specdiff.gguf, "sha256_file", lambda p: hashed.append(Path(p).name) or sha256_file(p))
    monkeypatch.setattr(specdiff.gguf, "convert", lambda *a: pytest.fail("converted again"))
    specdiff.gguf.gguf_directory(specdiff.gguf.GGUFSource(str(llama_gguf[0])))
    assert hashed == [llama_gguf[0].name]  # the GGUF file itself, as before


def test_an_entry_that_cannot_be_rebuilt_is_one_line_naming_the_cache(entry, llama_gguf, tmp_path):
    """A file-size limit (as on a full disk) lets the damaged entry be removed, not rewritten."""
    limit = (entry / "model.safetensors").stat().st_size // 2
    (entry / "model.safetensors").unlink()
    code = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
        from specdiff.errors import LoadError
        from specdiff.loading import load_target
        try:
            load_target({str(llama_gguf[0])!r})
        except LoadError as e:
            print(e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.stdout.count("\n") == 1, run.stdout + run.stderr
    assert "specdiff's cache" in run.stdout and "File too large" in run.stdout
    assert "SPECDIFF_CACHE" in run.stdout and "Traceback" not in run.stderr
    assert [p.name for p in entry.parent.iterdir()] == []  # the damaged entry went, no half entry came


def test_a_damaged_entry_in_a_read_only_cache_is_one_line(entry, llama_gguf, monkeypatch, capsys):
    """It said "converting it again" before the error that it could not even remove the entry."""
    import specdiff.gguf

    def read_only(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    (entry / "config.json").unlink()
    monkeypatch.setattr(specdiff.gguf, "remove", read_only)
    with pytest.raises(LoadError, match=f"specdiff's cache entry {entry} is not usable .* cannot be removed "
                                        r"\(Read-only file system\): delete it, or set SPECDIFF_CACHE"):
        load_target(str(llama_gguf[0]))
    assert capsys.readouterr().err == ""


def killed_in(out: Path) -> Path:
    """The temporary directory of a process killed (kill -9) inside new_directory(out)."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom specdiff.atomic import new_directory\n"
            f"with new_directory(Path({str(out)!r})) as tmp:\n"
            "    (tmp / 'half').write_bytes(bytes(1000))\n    print(tmp, flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tmp = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert tmp.is_dir() and tmp.parent == out.parent and str(proc.pid) in tmp.name
    return tmp


def test_a_killed_conversion_is_removed_by_the_next_run(entry, llama_gguf):
    """Before, each killed conversion left a hidden 538 MB directory that no run removed."""
    left = killed_in(entry.parent / "0123456789abcdef")
    load_target(str(llama_gguf[0]))  # its entry is sound: nothing is converted, stale ones go anyway
    assert not left.exists() and [p.name for p in entry.parent.iterdir()] == [entry.name]


def test_only_stale_temporary_directories_are_removed(tmp_path):
    """Of the hidden directories beside a target: a killed process's goes; a running one's, another
    host's, and anything not named by specdiff stay."""
    killed = killed_in(tmp_path / "step-0000010")
    running = temp_path(tmp_path / "step-0000020")
    dead = killed.name.split("-")[-2]  # .step-0000010.<host>-<pid>-<random>.tmp
    elsewhere = ("0" if host()[0] != "0" else "1") + host()[1:]
    other_host = tmp_path / f".step-0000030.{elsewhere}-{dead}-abcdef01.tmp"
    foreign = [tmp_path / ".step-0000040-k2j3h4x9", tmp_path / ".cache", tmp_path / "step-0000050"]
    for d in (running, other_host, *foreign):
        d.mkdir()
    with new_directory(tmp_path / "step-0000060") as tmp:
        (tmp / "state.pt").write_bytes(b"x")
    assert not killed.exists()
    assert all(d.is_dir() for d in (running, other_host, *foreign, tmp_path / "step-0000060"))


def test_a_killed_publish_is_removed_by_the_next(tmp_path):
    """distill writes its drafter through a hidden directory in DIR, as its checkpoints."""
    killed = killed_in(tmp_path / "drafter")
    publish(tmp_path, lambda d: (d / "config.json").write_text("{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"] and not killed.exists()
    assert temp_directory(tmp_path / "x").name.startswith(".x.")
