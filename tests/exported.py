"""The tiny models of the `tiny` fixture exported once per session, shared by the export, runtime
and TensorRT tests. A test module loads these fixtures with

    pytest_plugins = ["exported"]
"""

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
def onnx_llama(tiny) -> Path:
    """A tied-head GQA Llama (SmolLM2's shape, tiny) + tiny.drafter, fp32."""
    from tiny import make_llama

    llama = make_llama(tiny.root / "llama-tied", tiny.tokenizer, scale=10, seed=3, tied=True)
    tiny.llama = llama
    return _export(tiny.root / "export-llama", ["--target", str(llama), "--drafter", str(tiny.drafter)])


@pytest.fixture(scope="session")
def onnx_dflash(tiny) -> Path:
    """tiny.gpt2 (a 320-row head for 300 tokens) + a random DFlash drafter over it (block 8, reading
    layers 0 and 1), fp32, batch up to 3; the drafter's directory is tiny.dflash."""
    from tiny import make_dflash

    tiny.dflash = make_dflash(tiny.root / "export-dflash-drafter", tiny.gpt2, scale=10, seed=6)
    return _export(tiny.root / "export-dflash", ["--target", str(tiny.gpt2), "--drafter", str(tiny.dflash),
                                                 "--max-batch", "3"])


@pytest.fixture(scope="session")
def onnx_eagle3(tiny) -> Path:
    """tiny.gpt2 (a 320-row head for 300 tokens) + a random EAGLE-3 head over it (reading layers 0, 1
    and 1, a draft vocabulary of 200 ids, its own embedding), fp32, batch up to 3; the head's
    directory is tiny.eagle3."""
    from tiny import make_eagle3

    tiny.eagle3 = make_eagle3(tiny.root / "export-eagle3-head", tiny.gpt2, seed=6, scale=10)
    return _export(tiny.root / "export-eagle3", ["--target", str(tiny.gpt2), "--drafter", str(tiny.eagle3),
                                                 "--max-batch", "3"])
