"""Models over exported graphs, whatever runtime executes them.

GraphTarget implements the specdiff.contracts.Target contract over a target step graph; its KV cache
is 2L explicit tensors (B, H, P, D) fed back as the next call's past. rollback(n) slices them to
n positions; the slice is not contiguous, so the runtime copies it before binding it by pointer.
GraphDrafter exposes what DiffusionProposer and plan use of a DiffusionDrafter (x0_logits,
mask_id, vocab_size, context_length, tokenizer, the recorded draft `defaults`) over a denoiser
graph; the parameterisation and the noise level are computed in Python exactly as the PyTorch
drafter does.
"""

from __future__ import annotations

import torch

from specdiff.drafters.diffusion import loglinear_sigma
from specdiff.nets.parameterization import x0_logits

from specdiff.graphs import TORCH_DTYPES, past_names, present_names


class GraphTarget:
    """A causal LM step graph as a Target. model: the manifest's `model` record of the target."""

    def __init__(self, runtime, model: dict, tokenizer, device, *, dtype: str,
                 max_length: int | None = None, max_step: int | None = None):
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.name = model["name"]
        self.vocab_size = model["vocab_size"]
        self.max_length = max_length or model["max_length"]
        self.max_step = max_step  # most tokens per graph call (None: any)
        self.eos_token_id = model["eos_token_id"]
        self._device = torch.device(device)
        self._heads, self._head_dim = model["kv_heads"], model["head_dim"]
        self._kv_dtype = TORCH_DTYPES[dtype]
        self._past_names, self._present_names = past_names(model["layers"]), present_names(model["layers"])
        self.past: list[torch.Tensor] = []

    @classmethod
    def from_artifacts(cls, art, runtime, device) -> "GraphTarget":
        model, limits = art.component("target")["model"], runtime.limits
        max_length = min(model["max_length"], limits.max_seq) if limits else None
        return cls(runtime, model, art.tokenizer, device, dtype=art.manifest["dtype"], max_length=max_length,
                   max_step=limits.max_step if limits else None)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def length(self) -> int:
        return self.past[0].shape[2] if self.past else 0

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, S) -> logits (B, S, V), float32, over an empty cache."""
        empty = torch.zeros(ids.shape[0], self._heads, 0, self._head_dim,
                            dtype=self._kv_dtype, device=self.device)  # (B, H, 0, D)
        self.past = [empty] * len(self._past_names)
        return self.extend(ids)

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, S) -> logits (B, S, V), float32; fed in chunks of at most max_step tokens."""
        chunks = ids.split(self.max_step, dim=1) if self.max_step else (ids,)
        return torch.cat([self._step(chunk) for chunk in chunks], dim=1)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        B, S = ids.shape
        P = self.length
        feeds = {"input_ids": ids,
                 "attention_mask": torch.ones(B, P + S, dtype=torch.int64, device=ids.device),
                 "position_ids": torch.arange(P, P + S, device=ids.device).expand(B, S),
                 **dict(zip(self._past_names, self.past))}
        out = self.runtime.run(feeds)
        self.past = [out[name] for name in self._present_names]  # each (B, H, P + S, D)
        return out["logits"][..., : self.vocab_size].float()

    def extend_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (K, S) -> logits (K, S, V): the one cached row repeated K times, each extended by
        its row of ids (K candidate drafts, specdiff.selection); keep_row(k) goes back to one."""
        self.past = [t.expand(ids.shape[0], -1, -1, -1) for t in self.past]  # (K, H, P, D), no copy
        return self.extend(ids)

    def keep_row(self, k: int) -> None:
        self.past = [t[k:k + 1] for t in self.past]

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        if length < self.length:
            self.past = [t[:, :, :length] for t in self.past]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class GraphDrafter:
    """A diffusion denoiser graph with the drafting interface of DiffusionDrafter.
    model: the manifest's `model` record of the drafter."""

    def __init__(self, runtime, model: dict, tokenizer, device):
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.source = model["name"]
        self.vocab_size = model["vocab_size"]
        self.mask_id = model["mask_id"]
        self.context_length = model["context_length"]
        self.parameterization = model["parameterization"]
        self.time_conditioning = model["time_conditioning"]
        self.defaults = model.get("defaults", {})  # recorded draft settings (absent before they were exported)
        self.device = torch.device(device)

    @classmethod
    def from_artifacts(cls, art, runtime, device) -> "GraphDrafter":
        return cls(runtime, art.component("drafter")["model"], art.tokenizer, device)

    def x0_logits(self, input_ids: torch.Tensor, last: int | None = None) -> torch.Tensor:
        """(B, L) ids with mask slots -> logits of x0 over the real vocabulary at the last `last`
        positions (B, last, V) (default: all L), fp32 (the graph computes all L)."""
        t = (input_ids == self.mask_id).float().mean(dim=1)  # fraction masked, (B,)
        sigma = loglinear_sigma(t)
        feeds = {"input_ids": input_ids, **({"sigma": sigma} if self.time_conditioning else {})}
        ids = input_ids[:, -(last or 0):]
        raw = self.runtime.run(feeds)["logits"][:, -(last or 0):]  # (B, last, V_drafter)
        return x0_logits(self.parameterization, raw, ids, sigma, self.mask_id, self.vocab_size)
