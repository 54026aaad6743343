"""Loading models: the library draws no "Loading weights" bars, and leaves transformers' settings
as the user set them."""

from __future__ import annotations

from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from specdiff.loading import load_drafter, load_target


def test_loading_draws_no_weight_bars_and_restores_the_hook(tiny, capfd):
    def user_hook(factory, args, kwargs):
        return factory(*args, **kwargs)

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # conftest turns bars off; a user may have them on
    previous = hf_logging.set_tqdm_hook(user_hook)
    try:
        capfd.readouterr()
        AutoModelForCausalLM.from_pretrained(str(tiny.gpt2))
        assert "Loading weights" in capfd.readouterr().err  # else the check below is blind
        load_target(str(tiny.gpt2))
        load_drafter(str(tiny.ar))
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()
        assert hf_logging.set_tqdm_hook(previous) is user_hook
    finally:
        hf_logging.set_tqdm_hook(previous)
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()
