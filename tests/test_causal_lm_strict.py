"""Targets and AR drafters load strictly: weights that do not match config.json (a tensor missing,
one unexpected, one mis-shaped, a config with a layer more) are one LoadError line naming the
keys, never a model with random or ignored weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from specdiff.drafters.autoregressive import ARDrafter
from specdiff.errors import LoadError
from specdiff.loading import load_drafter, load_target
from specdiff_cli.main import cli


def altered_copy(src: Path, dst: Path, change_state=None, **config_changes) -> Path:
    """A copy of the model at src with its state dict and config.json changed."""
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    state = load_file(str(weights))
    if change_state:
        change_state(state)
    save_file(state, str(weights), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **config_changes}))
    return dst


CASES = {
    "missing": (lambda s: s.pop("transformer.h.1.mlp.c_fc.bias"), {},
                "missing transformer.h.1.mlp.c_fc.bias"),
    "unexpected": (lambda s: s.update({"transformer.h.0.extra": torch.zeros(3)}), {},
                   "unexpected transformer.h.0.extra"),
    "mis-shaped": (lambda s: s.update({"transformer.h.0.mlp.c_fc.bias": torch.zeros(5)}), {},
                   "shape of transformer.h.0.mlp.c_fc.bias: expected (128,), found (5,)"),
    "extra layer in config": (None, {"n_layer": 3}, "missing transformer.h.2."),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_target_weights_must_match_config(tiny, tmp_path, case):
    change, config, fragment = CASES[case]
    bad = altered_copy(tiny.gpt2, tmp_path / "bad", change, **config)
    with pytest.raises(LoadError) as e:
        load_target(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: weights do not match config.json: ") and fragment in msg
    with pytest.raises(LoadError, match="weights do not match config.json"):
        load_drafter(str(bad))  # an AR drafter goes through the same loader


def test_many_problems_are_counted_not_listed(tiny, tmp_path):
    bad = altered_copy(tiny.gpt2, tmp_path / "bad", n_layer=3)
    with pytest.raises(LoadError, match=r"; \.\.\. \(12 in all\)$"):
        load_target(str(bad))


def test_tied_head_is_not_missing(tiny):
    """GPT-2 stores no lm_head.weight (tied to wte): it loads, and so does the neo model."""
    assert "lm_head.weight" not in load_file(str(Path(tiny.gpt2) / "model.safetensors"))
    assert load_target(str(tiny.gpt2)).vocab_size == 300
    assert isinstance(load_drafter(str(tiny.ar)), ARDrafter)
    load_target(str(tiny.neo))


def test_cli_one_line(tiny, tmp_path):
    bad = altered_copy(tiny.gpt2, tmp_path / "bad", lambda s: s.pop("transformer.ln_f.weight"))
    result = CliRunner().invoke(cli, ["generate", "--target", str(bad), "--method", "ar", "--prompt", "The sea"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("specdiff: error: ") and "missing transformer.ln_f.weight" in result.stderr
