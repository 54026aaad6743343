"""The tiny models of the `tiny` fixture, and three drafters over them, exported once per session,
shared by the export, runtime and TensorRT tests. A test module loads these fixtures with

    pytest_plugins = ["exported"]

Each fixture returns the directory it builds (the drafters' too: tiny_dflash, tiny_eagle3) and adds
nothing to `tiny`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner


def _export(out: Path, args: list[str]) -> Path:
    from specdiff_cli.main import cli

    result = CliRunner().invoke(cli, ["export", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out}\n"  # stdout: the result only
    return out


@pytest.fixture(scope="session")
def onnx_pair(tiny) -> Path:
    """tiny.gpt2 + tiny.drafter, fp32, batch up to 3, through `specdiff export`."""
    return _export(tiny.root / "export-pair", ["--target", str(tiny.gpt2), "--drafter", str(tiny.drafter),
                                               "--max-batch", "3"])


@pytest.fixture(scope="session")
def onnx_neo(tiny) -> Path:
    """tiny.neo (global + local attention) alone, fp32."""
    return _export(tiny.root / "export-neo", ["--target", str(tiny.neo)])


@pytest.fixture(scope="session")
def tiny_llama_tied(tiny) -> Path:
    """A tied-head GQA Llama (SmolLM2's shape, tiny) over tiny's tokenizer."""
    from tiny import make_llama

    return make_llama(tiny.root / "llama-tied", tiny.tokenizer, scale=10, seed=3, tied=True)


@pytest.fixture(scope="session")
def onnx_llama(tiny, tiny_llama_tied) -> Path:
    """tiny_llama_tied + tiny.drafter, fp32."""
    return _export(tiny.root / "export-llama", ["--target", str(tiny_llama_tied), "--drafter", str(tiny.drafter)])


@pytest.fixture(scope="session")
def tiny_dflash(tiny) -> Path:
    """A random DFlash drafter over tiny.gpt2 (a 320-row head for 300 tokens): block 8, reading
    layers 0 and 1."""
    from tiny import make_dflash

    return make_dflash(tiny.root / "export-dflash-drafter", tiny.gpt2, scale=10, seed=6)


@pytest.fixture(scope="session")
def onnx_dflash(tiny, tiny_dflash) -> Path:
    """tiny.gpt2 + tiny_dflash, fp32, batch up to 3."""
    return _export(tiny.root / "export-dflash", ["--target", str(tiny.gpt2), "--drafter", str(tiny_dflash),
                                                 "--max-batch", "3"])


@pytest.fixture(scope="session")
def tiny_eagle3(tiny) -> Path:
    """A random EAGLE-3 head over tiny.gpt2 (a 320-row head for 300 tokens): reading layers 0, 1
    and 1, a draft vocabulary of 200 ids, its own embedding."""
    from tiny import make_eagle3

    return make_eagle3(tiny.root / "export-eagle3-head", tiny.gpt2, seed=6, scale=10)


@pytest.fixture(scope="session")
def onnx_eagle3(tiny, tiny_eagle3) -> Path:
    """tiny.gpt2 + tiny_eagle3, fp32, batch up to 3."""
    return _export(tiny.root / "export-eagle3", ["--target", str(tiny.gpt2), "--drafter", str(tiny_eagle3),
                                                 "--max-batch", "3"])
