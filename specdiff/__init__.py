"""specdiff: lossless speculative decoding with discrete-diffusion drafters.

    import specdiff
    target = specdiff.load_target("gpt2-xl")            # models.yaml name, directory or hub id
    drafter = specdiff.load_drafter("path/to/drafter")  # forward(input_ids, sigma) -> raw logits
    result = specdiff.generate(["Hello"], target=target, drafter=drafter, method="specdiff")
    print(result.texts[0], result.metrics.tau)
"""

from .errors import SpecdiffError
from .generation import GenerationResult, generate
from .loading import load_drafter, load_target
from .warping import Sampling

__all__ = ["GenerationResult", "Sampling", "SpecdiffError", "generate", "load_drafter", "load_target"]
__version__ = "0.1.0"
