"""A GGUF matrix's stored blocks as ONNX Runtime's `MatMulNBits` reads them, exactly (issue 50).

GGUF keeps a linear layer's weight W (N out x K in) as rows of blocks of 32 weights:
  Q4_0: fp16 d, 16 bytes of 4-bit codes q; w = d * (q - 8)
  Q4_1: fp16 d, fp16 m, 16 bytes of codes;  w = d * q + m
  Q8_0: fp16 d, 32 int8 codes q;            w = d * q
a block's 4-bit codes in llama.cpp's order (byte j: weight j in its low nibble, weight j + 16 in
its high one). `MatMulNBits` (com.microsoft) takes B (N, K/32, blob) with weight 2i in byte i's
low nibble and 2i + 1 in its high one, scales (N * K/32) and codes relative to its default zero
point 2^(bits-1). So Q4_0 is (codes, d) as they are; Q8_0 is (q + 128, d); Q4_1 is (codes, d) plus
its minimum as a separate fp32 term: w = d (q - 8) + m' with m' = m + 8d (in fp32: exact while
|m| and 8|d| are within a factor 2^12 of each other, as a block's minimum and scale are), and
for x (.., K) x . w = sum over blocks b of d_b (x_b . (q_b - 8)) + m'_b sum(x_b), the second sum
a (.., K/32) @ (K/32, N) MatMul of the block sums of x. (Zero points 0 and m itself are as exact
but cancel more: measured 2x the rounding error.) Every weight is then the one GGUF's own
dequantization gives; only the order of the fp32 sums differs from x @ W.T. Float zero points
would send MatMulNBits down an unpacked slow path.

Needs numpy (and, for the ONNX nodes, onnx); the GGUF tensor comes from gguf.GGUFReader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK = 32  # weights per GGUF block (Q4_0, Q4_1, Q8_0)
BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # the GGUF types read as stored blocks
DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Blocks:
    """One matrix W (N, K) as MatMulNBits inputs: codes (N, K/32, 16 | 32) uint8 (zero point
    2^(bits-1)), scales (N, K/32) fp32, minimum (N, K/32) fp32 or None (Q4_1's m + 8d)."""

    kind: str
    codes: np.ndarray
    scales: np.ndarray
    minimum: np.ndarray | None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K)."""
        return self.codes.shape[0], self.codes.shape[1] * BLOCK

    @property
    def bits(self) -> int:
        return BITS[self.kind]

    def dequantized(self) -> np.ndarray:
        """W (N, K) fp32, computed from the stored fields as GGUF defines the type."""
        n, k = self.shape
        q = unpack4(self.codes) - 8 if self.bits == 4 else self.codes.astype(np.float32) - 128
        w = q * self.scales[..., None]
        if self.minimum is not None:
            w = w + self.minimum[..., None]
        return np.asarray(w, dtype=np.float32).reshape(n, k)


def from_gguf(kind: str, raw: np.ndarray) -> Blocks:
    """A GGUF tensor's bytes (N, K/32 * bytes per block) uint8 (GGUFReader's `data`) -> Blocks."""
    if kind not in BITS:
        raise ValueError(f"{kind} is not read as stored blocks (only {', '.join(BITS)})")
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    n = raw.shape[0]
    b = np.ascontiguousarray(raw).reshape(n, -1, size)
    scales = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        codes = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Blocks(kind, codes, scales, None)
    if kind == "Q4_0":
        return Blocks(kind, repack4(b[..., 2:]), scales, None)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    minimum = (m + 8 * scales.astype(np.float64)).astype(np.float32)
    return Blocks(kind, repack4(b[..., 4:]), scales, minimum)


def repack4(qs: np.ndarray) -> np.ndarray:
    """llama.cpp's 4-bit block bytes (.., 16) (weight j low, j + 16 high) -> MatMulNBits' (.., 16)
    (weight 2i low, 2i + 1 high)."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # (.., 32) in weight order
    return np.asarray(q[..., 0::2] | (q[..., 1::2] << 4), dtype=np.uint8)


def unpack4(codes: np.ndarray) -> np.ndarray:
    """MatMulNBits' 4-bit bytes (.., 16) -> the codes (.., 32) fp32 in weight order."""
    q = np.stack([codes & 0x0F, codes >> 4], axis=-1)
    return q.reshape(*codes.shape[:-1], BLOCK).astype(np.float32)


def rows(blocks: Blocks, order: np.ndarray) -> Blocks:
    """The blocks of W's rows in `order` (N,) (e.g. llama.cpp's Q / K permutation undone)."""
    minimum = None if blocks.minimum is None else blocks.minimum[order]
    return Blocks(blocks.kind, blocks.codes[order], blocks.scales[order], minimum)


def split8(blocks: Blocks) -> tuple[Blocks, Blocks]:
    """Q8_0 blocks as two 4-bit ones, exactly: q = 16 hi + lo (hi in -8..7, lo in 0..15), so
    w = d q = 16d (hi' - 8) + d (lo' - 8) + 8d with hi' = hi + 8, lo' = lo; -> (hi' with scales
    16d, lo' with scales d and minimum 8d). ONNX Runtime's 8-bit MatMulNBits has no fp32 kernel
    (accuracy level 0 / 1 runs unpacked); its 4-bit one has."""
    assert blocks.kind == "Q8_0"
    q = blocks.codes.astype(np.int16) - 128
    hi, lo = (q >> 4) + 8, q & 0x0F

    def pack(codes: np.ndarray) -> np.ndarray:
        return np.asarray(codes[..., 0::2] | (codes[..., 1::2] << 4), dtype=np.uint8)

    return (Blocks("Q4_0", pack(hi), 16 * blocks.scales, None),
            Blocks("Q4_1", pack(lo), blocks.scales, 8 * blocks.scales))


def block_sums(x: str, k: int, prefix: str) -> tuple[list[Any], list[Any]]:
    """Nodes computing `{prefix}.sums` (B, S, K/32), the sums of x (B, S, K)'s blocks of 32, and
    their initializers."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([0, 0, k // BLOCK, BLOCK], dtype=np.int64), f"{prefix}.blocked"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{prefix}.last")]
    nodes = [helper.make_node("Reshape", [x, f"{prefix}.blocked"], [f"{prefix}.x_blocks"], name=f"{prefix}.blocks"),
             helper.make_node("ReduceSum", [f"{prefix}.x_blocks", f"{prefix}.last"], [f"{prefix}.sums"],
                              name=f"{prefix}.sum", keepdims=0)]
    return nodes, inits


def matmul_nodes(x: str, out: str, blocks: Blocks, prefix: str, accuracy_level: int = 0,
                 sums: str | None = None) -> tuple[list[Any], list[Any]]:
    """ONNX nodes computing out (B, S, N) = x (B, S, K) @ W.T from the stored blocks, and their
    initializers: MatMulNBits, plus for Q4_1 Add(block sums of x (B, S, K/32) @ m.T (K/32, N));
    sums: the name of x's block sums where the graph computes them already (block_sums)."""
    from onnx import helper, numpy_helper

    if accuracy_level not in (0, 1):
        raise ValueError("accuracy_level 0 or 1 (fp32 arithmetic); 4 quantizes the activations")
    n, k = blocks.shape
    inits = [numpy_helper.from_array(blocks.codes, f"{prefix}.codes"),
             numpy_helper.from_array(blocks.scales.reshape(-1), f"{prefix}.scales")]
    inputs = [x, f"{prefix}.codes", f"{prefix}.scales"]
    product = out if blocks.minimum is None else f"{prefix}.product"
    nodes = [helper.make_node("MatMulNBits", inputs, [product], name=f"{prefix}.nbits", domain=DOMAIN, K=k, N=n,
                              bits=blocks.bits, block_size=BLOCK, accuracy_level=accuracy_level)]
    if blocks.minimum is None:
        return nodes, inits
    if sums is None:
        more, constants = block_sums(x, k, prefix)
        nodes, inits, sums = nodes + more, inits + constants, f"{prefix}.sums"
    inits.append(numpy_helper.from_array(np.ascontiguousarray(blocks.minimum.T), f"{prefix}.minimum"))
    nodes += [helper.make_node("MatMul", [sums, f"{prefix}.minimum"], [f"{prefix}.offset"],
                               name=f"{prefix}.minimum_term"),
              helper.make_node("Add", [product, f"{prefix}.offset"], [out], name=f"{prefix}.add")]
    return nodes, inits
