"""specdiff: lossless speculative decoding with discrete-diffusion drafters.

    import specdiff
    target = specdiff.load_target("gpt2-xl")            # models.yaml name, directory or hub id
    drafter = specdiff.load_drafter("path/to/drafter")  # forward(input_ids, sigma) -> raw logits
    result = specdiff.generate(["Hello"], target=target, drafter=drafter, method="specdiff")
    print(result.texts[0], result.metrics.tau)
"""

from importlib import import_module

from .errors import SpecdiffError

__all__ = ["GenerationResult", "Sampling", "SpecdiffError", "generate", "load_drafter", "load_target",
           "stream"]
__version__ = "0.1.0"  # the one source: pyproject.toml and `specdiff --version` read it
_LAZY = {"GenerationResult": ".generation", "generate": ".generation", "stream": ".generation",
         "load_drafter": ".loading",
         "load_target": ".loading", "Sampling": ".sampling"}


def __getattr__(name: str) -> object:
    """Import torch-backed names on first use, so that `import specdiff.errors` (and with it
    `specdiff --help`) stays free of torch and transformers."""
    if name not in _LAZY:
        raise AttributeError(f"module 'specdiff' has no attribute '{name}'")
    return getattr(import_module(_LAZY[name], __name__), name)
