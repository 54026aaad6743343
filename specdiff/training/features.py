"""The target's hidden states of the teacher sequences, for `specdiff distill --method dflash` and
`--method eagle3`.

A DFlash drafter or an EAGLE-3 head reads the outputs of some target layers (nets/dflash.py,
nets/eagle3.py: the same concatenation, so both read one cache of the same layers). Training needs them at
every position of every teacher sequence; the target is frozen, so they are computed once, with the
target alone (no head), and cached beside the teacher data, a chunk at a time (resumable):

    DATA/features-1-14-27/train-00000.safetensors   {"features": (CHUNK, P + L, n_ids * H) fp16}
    DATA/features-1-14-27/val.safetensors           the held-out sequences'

Row r's features are those the target computes at inference: its left padding (pad tokens before
the templated prompt) is kept out of attention and positions, so position 0 is its first real
token; the padding rows' features are zeros and never read (Blocks masks them). The teacher loop
leaves them itself when it generates a chunk (teacher.continue_batch); this pass fills the rest.

Training reads the rows from their files as it needs them (MappedFeatures: 1.6 GB per 2,048
answers of SmolLM2, more than memory holds over many caches), the held-out rows too.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from ..atomic import new_file
from ..errors import LoadError
from ..nets.checkpoint import save_tensors
from ..nets.dflash import context_features
from .sequences import Sequences
from .teacher import CHUNK

ROWS_PER_CALL = 16  # sequences through the target at once


def padding(ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """(M, W) left-padded rows -> (M,) the number of pad tokens before each row's first real one."""
    if pad_id is None:
        return torch.zeros(len(ids), dtype=torch.long)
    return (ids != pad_id).long().argmax(1)


@torch.no_grad()
def sequence_features(model: Any, ids: torch.Tensor, pad: torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """A Hugging Face causal LM's features of rows (B, W) left-padded by pad (B,) ->
    (B, W, n_ids * H) fp16 (zeros on padding), the outputs of target layers `layer_ids` (0-based)."""
    device = next(model.parameters()).device
    ids = ids.to(device)
    mask = (torch.arange(ids.shape[1], device=device) >= pad.to(device)[:, None]).long()
    out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                           output_hidden_states=True, use_cache=False)
    features = context_features(out.hidden_states, layer_ids) * mask[..., None]
    return features.half().cpu()


def features_directory(data: Path, layer_ids: Sequence[int]) -> Path:
    return data / f"features-{'-'.join(map(str, layer_ids))}"


class MappedFeatures:
    """Rows (M, W, F) fp16 of a list of cache files ({"features": (m_i, W, F)}, M = sum of m_i, in
    order), read from the files (memory-mapped by safetensors) a batch of rows at a time."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = list(paths)
        self.starts = torch.tensor([0, *itertools.accumulate(map(_rows, self.paths))])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (B,) -> (B, W, F), in that order."""
        files = torch.searchsorted(self.starts, rows, right=True) - 1
        out: list[torch.Tensor | None] = [None] * len(rows)
        for file in files.unique().tolist():
            at = torch.nonzero(files == file)[:, 0].tolist()
            with safe_open(str(self.paths[file]), framework="pt") as f:
                chunk = f.get_slice("features")
                for j in at:
                    i = int(rows[j] - self.starts[file])
                    out[j] = chunk[i:i + 1]
        return torch.cat(out)  # type: ignore[arg-type]

    def __add__(self, other: MappedFeatures) -> MappedFeatures:
        return MappedFeatures(self.paths + other.paths)


def _rows(path: Path) -> int:
    """The rows of a cache file; a LoadError naming it, and what to do, where it cannot be read."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return int(f.get_slice("features").get_shape()[0])
    except (OSError, SafetensorError) as e:  # missing, truncated, no features
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{path}: damaged target features ({why}); delete it, and the next run computes it "
                        "again") from e


def cached_features(data: Path, model: Any, train: Sequences, val: Sequences, pad_id: int | None,
                    layer_ids: Sequence[int], progress: bool) -> tuple[MappedFeatures, MappedFeatures]:
    """The features of the train and val sequences (M, W, F) fp16, mapped from the cache under
    `data`, computed first where missing (a chunk of CHUNK rows a file, as the teacher data is
    written)."""
    root = features_directory(data, layer_ids)
    root.mkdir(parents=True, exist_ok=True)
    chunks = [(root / f"train-{c:05d}.safetensors", train.ids[c * CHUNK:(c + 1) * CHUNK])
              for c in range(-(-len(train) // CHUNK))] + [(root / "val.safetensors", val.ids)]
    todo = sum(len(ids) for path, ids in chunks if not path.is_file())
    bar = tqdm(total=todo, disable=not progress or not todo, unit="seq", desc="target features")
    for path, ids in chunks:
        if not path.is_file():
            pad = padding(ids, pad_id)
            feats = torch.cat([sequence_features(model, ids[i:i + ROWS_PER_CALL], pad[i:i + ROWS_PER_CALL], layer_ids)
                               for i in range(0, len(ids), ROWS_PER_CALL)])
            with new_file(path) as tmp:
                save_tensors({"features": feats}, tmp)
            bar.update(len(ids))
    bar.close()
    return MappedFeatures([path for path, _ in chunks[:-1]]), MappedFeatures([chunks[-1][0]])
