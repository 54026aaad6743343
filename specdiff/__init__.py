"""specdiff: lossless speculative decoding with discrete-diffusion drafters.

    import specdiff
    target = specdiff.load_target("gpt2-xl")            # models.yaml name, directory or hub id
    drafter = specdiff.load_drafter("path/to/drafter")  # forward(input_ids, sigma) -> raw logits
    result = specdiff.generate(["Hello"], target=target, drafter=drafter, method="specdiff")
    print(result.texts[0], result.metrics.tau)

Rooms (each package's docstring says what lives there and what it may import):
    generation/   the API: settings resolved, the plan, prompts, streaming (generate, stream)
    methods/      the decoding methods and the Decoder each prepares (plain, speculative,
                  dflash, blocks); settings.py declares every setting once
    decoding.py block_decoding.py simsd.py selection.py trees.py acceptance.py sampling.py metrics.py
                  the algorithm: decoding loops, rules, draft trees, warping, metrics (contracts.py:
                  the types)
    adaptive.py   gamma auto: each step's draft length from past acceptance and measured costs
    tree_sizes.py tree auto: each step's draft tree size from its q, past acceptance and costs
    vocab.py      draft vocabularies: a drafter head's N target ids, widened to q over all V
    targets/ drafters/ nets/   the models: target kinds, proposers, networks and formats
    kinds/        the kinds of drafter, one declaration each (detected, loaded, paired, compiled,
                  exported, benched): what loading, the methods, export and bench read
    loading.py sources.py registry.py gguf.py hub.py hf_cache.py requests.py   models and requests
                  in: models.yaml, hub and GGUF sources, checks made before anything loads
    graphs.py artifacts.py     the export contract shared with exporters/ and runtimes/
    exporters/ runtimes/   `specdiff export` (ONNX, TensorRT) and what runs its graphs (ONNX
                  Runtime, TensorRT) behind contracts.Runtime
    compiled.py budget.py      --compile and the memory a step needs
    ray.py        scale-out over a Ray actor pool
    text.py errors.py names.py resources.py atomic.py reading.py extras.py   stop strings and
                  incremental text, the error types, torch-free names, package data, atomic writes,
                  bounded reads, optional extras
    tools/ training/   built on the above, never imported by it: bench, convert, drafter init;
                  distillation
May import: torch, transformers and the field's libraries. The algorithm and the API import neither
tools/, training/, runtimes/ nor exporters/, nor specdiff_cli (tests/test_layout.py).
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
