"""The DDiT backbone shared by SEDD and MDLM (see docs/diffusion-checkpoints.md).

An adaLN-modulated bidirectional transformer over token ids, conditioned on a noise level sigma:

    x = E[ids]                                   # (B, L, h), no positional embedding
    c = SiLU(MLP([cos(sigma f), sin(sigma f)]))  # (B, cond); f_k = 10000^(-k/128), k < 128
    per block: shift/scale/gate for attention, then for the MLP, from adaLN(c)
        x = x + gate_msa * W_out Attn(rotary(modulate(LN(x) * w1, shift_msa, scale_msa)))
        x = x + gate_mlp * MLP(modulate(LN(x) * w2, shift_mlp, scale_mlp))
    logits = Linear(modulate(LN(x) * w_f, shift, scale))          # (B, L, V)

LN has no bias and runs in fp32; rotary is half-split (GPT-NeoX layout) over all head dims of q and
k with base 10000; attention is full (not causal); MLP is Linear, GELU(tanh), Linear. Parameter
names are the SEDD ones, so a SEDD state dict loads as is and an MDLM one after dropping the
`backbone.` prefix.

`DDiT.forward` returns raw logits over every row of the head (mask id included); turning them into
the drafter's x0 distribution is the parameterisation's job (`specdiff.nets.parameterization`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F
from torch import nn

FREQ_EMBED_DIM = 256
ROTARY_BASE = 10000.0


@dataclass(frozen=True)
class DiTConfig:
    """Shape of a DDiT backbone. `vocab_size` counts every row of the head (mask id included)."""

    vocab_size: int
    hidden_size: int = 768
    n_heads: int = 12
    n_blocks: int = 12
    cond_dim: int = 128
    mlp_ratio: int = 4
    time_conditioning: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_heads or (self.hidden_size // self.n_heads) % 2:
            raise ValueError(
                f"hidden_size {self.hidden_size} must split into {self.n_heads} heads of even size"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LayerNorm(nn.Module):
    """Bias-free layer norm, normalised in fp32: LN(x) * weight."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.float(), [x.shape[-1]])
        return y.to(self.weight.dtype) * self.weight


class TimestepEmbedder(nn.Module):
    """sigma [B] -> MLP(sinusoidal features) [B, cond]; cosines first, 128 frequencies."""

    def __init__(self, cond_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_EMBED_DIM, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        half = FREQ_EMBED_DIM // 2
        k = torch.arange(half, dtype=torch.float32, device=sigma.device)
        freqs = torch.exp(-math.log(10000.0) * k / half)
        args = sigma.float()[:, None] * freqs[None]  # (B, 128)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, 256)
        return cast(torch.Tensor, self.mlp(emb.to(next(self.mlp.parameters()).dtype)))


class Rotary(nn.Module):
    """Half-split rotary tables; `inv_freq` is a persistent buffer, as in the public checkpoints.

    The buffer stays fp32 when the model is cast (`.half()`, `.to(dtype)`): rounded to fp16, the
    angles p * inv_freq would be off by up to 0.16 rad at p = 1000 (bf16: 0.44 rad). Device moves
    still apply."""

    inv_freq: torch.Tensor  # (head_dim / 2,) fp32, a registered buffer

    def __init__(self, head_dim: int):
        super().__init__()
        inv_freq = 1.0 / ROTARY_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=True)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Rotary:
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # torch leaves Module._apply unannotated
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, length: int, device: torch.device,
                pad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> cos, sin, each (L, head_dim), rebuilt per call (no stale cross-device cache); with
        `pad` (B,), the padding before each row, (B, 1, L, head_dim): a row's first real token
        is at position 0, as it would be alone."""
        pos = torch.arange(length, device=device, dtype=torch.float32)
        if pad is not None:
            pos = (pos - pad[:, None, None].to(device)).clamp_min(0)  # (B, 1, L)
        theta = pos[..., None] * self.inv_freq.float().to(device)  # (L or B, 1, L, head_dim/2)
        theta = torch.cat([theta, theta], dim=-1)
        return theta.cos(), theta.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, D): [a cos - b sin, b cos + a sin] with a, b the two halves of D."""
    a, b = x.chunk(2, dim=-1)
    rotated = torch.cat([-b, a], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class DDiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        h = cfg.hidden_size
        self.n_heads = cfg.n_heads
        self.norm1 = LayerNorm(h)
        self.attn_qkv = nn.Linear(h, 3 * h, bias=False)
        self.attn_out = nn.Linear(h, h, bias=False)
        self.norm2 = LayerNorm(h)
        self.mlp = nn.Sequential(
            nn.Linear(h, cfg.mlp_ratio * h), nn.GELU(approximate="tanh"), nn.Linear(cfg.mlp_ratio * h, h)
        )
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 6 * h)

    def forward(self, x: torch.Tensor, c: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, h), c (B, cond), cos/sin (L or B, 1, L, head_dim), keys (B, 1, 1, L) bool:
        the positions attention may read (None: all) -> (B, L, h)."""
        B, L, h = x.shape
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.adaLN_modulation(c)[:, None].chunk(6, dim=2)  # each (B, 1, h)
        )
        qkv = self.attn_qkv(modulate(self.norm1(x), shift_msa, scale_msa))
        q, k, v = qkv.view(B, L, 3, self.n_heads, h // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, L, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=False)  # (B, H, L, D)
        attn = attn.transpose(1, 2).reshape(B, L, h)
        x = x + gate_msa * self.attn_out(attn)
        return cast(torch.Tensor, x + gate_mlp * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp)))


class FinalLayer(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.norm_final = LayerNorm(cfg.hidden_size)
        self.linear = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 2 * cfg.hidden_size)

    def forward(self, x: torch.Tensor, c: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
        """x (B, L, h), c (B, cond) -> logits (B, L, vocab), or (B, L, N) of `head`'s N rows
        (a draft vocabulary's, in place of `linear`)."""
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=2)
        return cast(torch.Tensor, (head or self.linear)(modulate(self.norm_final(x), shift, scale)))


class Embedding(nn.Module):
    """A raw `embedding` parameter indexed by row (the checkpoints' name, not nn.Embedding's)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids]


class DDiT(nn.Module):
    """The denoiser: forward(input_ids (B, L) int64, sigma (B,) float) -> raw logits (B, L, V);
    with `last`, logits of the last `last` positions only (B, last, V): drafting reads only the
    gamma draft slots, and the output projection is the largest matmul of a small drafter.
    With `pad` (B,): row b starts after pad[b] padding positions, which no position attends to.
    With `head`: the output projection's rows at a draft vocabulary's ids (B, L or last, N)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.config = cfg
        self.vocab_embed = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.sigma_map = TimestepEmbedder(cfg.cond_dim)
        self.rotary_emb = Rotary(cfg.head_dim)
        self.blocks = nn.ModuleList(DDiTBlock(cfg) for _ in range(cfg.n_blocks))
        self.output_layer = FinalLayer(cfg)

    def forward(self, input_ids: torch.Tensor, sigma: torch.Tensor, last: int | None = None,
                pad: torch.Tensor | None = None, head: nn.Module | None = None) -> torch.Tensor:
        if not self.config.time_conditioning:
            sigma = torch.zeros_like(sigma)
        L = input_ids.shape[1]
        x = self.vocab_embed(input_ids)  # (B, L, h)
        c = F.silu(self.sigma_map(sigma))  # (B, cond)
        cos, sin = self.rotary_emb(L, input_ids.device, pad)
        keys = None if pad is None else (torch.arange(L, device=x.device) >= pad[:, None].to(x.device))[:, None, None]
        for block in self.blocks:
            x = block(x, c, cos, sin, keys)
        return cast(torch.Tensor, self.output_layer(x if last is None else x[:, -last:], c, head))  # (B, L or last, V or N)

    def init_random(self, generator: torch.Generator, std: float = 0.02) -> "DDiT":
        """Random weights everywhere (adaLN and head included, unlike training's zero init), so
        an untrained drafter still gives distinct, non-uniform drafts."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * std)
        return self
