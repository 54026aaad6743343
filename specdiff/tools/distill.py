"""`specdiff distill`: train a diffusion drafter to draft what one given target says.

Data (specdiff.tools.distill_data): the target's own continuations of random windows of a text file
(greedy or sampled: teacher settings, several samples per prompt, the target's top-k soft labels),
optionally mixed with raw text windows; every example is shaped like a drafting call: N clean
context tokens, then gamma slots masked as the l2r schedule with T steps masks them at one of
its steps (all gamma masked = oneshot / the first l2r step).

Objective, a loss registered by name in LOSSES (Slots -> scalar: the drafter runs once per batch), over the masked
draft slots whose clean token is not the mask id:
    ce         mean cross-entropy -log q(x0) over those slots (the default)
    mdlm       the MDLM ELBO: each slot's CE weighted by sigma'(t) / expm1(sigma(t)) (= 1/t for
               the log-linear schedule), summed per row over its n + gamma positions and divided
               by them; with t the fraction masked that is the row's mean CE.
    kl         forward KL(p || q) at each slot, averaged over slots, p = the target's
               distribution at that slot as the soft labels keep it: its top k ids, and the rest
               of the vocabulary as one more bin (one-hot on x0 for raw text rows). DistillSpec:
               acceptance min(1, p/q) when sampling rewards q close to p, which greedy-only hard
               labels do not teach; the rest bin keeps q from piling p's tail on the top k.
    a+b        the sum of two of these (e.g. ce+kl).
    streak     SpecDiff-2: -(mean over rows of sum_m c_m), c_m = prod_{i <= m} q_i, q_i the
               drafter's probability of the teacher token at slot i at the deployment
               temperature (draft_temperature): minus the expected accepted length when each
               token is accepted with its probability.
    ce-streak  SpecDiff-2: -(mean over rows of sum_j w_j log q_j), w_1 = 1, w_j = stop-gradient
               c_{j-1}: each slot's CE weighted by the chance of reaching it.
In the streak losses the product runs over a row's masked slots (clean l2r slots before them
count as reached; a slot whose token is the mask id, raw text only, as accepted).
q is the SUBS x0 distribution at a masked slot: softmax of the raw logits over the real
vocabulary, the mask id excluded (exactly what DiffusionProposer drafts from), with
sigma = loglinear_sigma(fraction of the row masked), as at inference.

Loop: AdamW, linear warmup then cosine decay to MIN_LR of the peak, gradient norm clipped at 1.
A checkpoint (weights, optimizer, step, batch RNG state = data position, validation history)
is written every K steps to DIR/checkpoints/step-NNNNNNN, the last KEEP of them kept; --resume
continues from the newest. At the end the drafter is written to DIR in the project's format
(config.json last: DIR is a drafter once config.json exists; it records gamma, T and the l2r
schedule as the drafter's defaults, which generate and bench use), then tau and alpha of specdiff
against the target are measured on held-out prompts, greedy and at eval_temperature, and
DIR/report.json is written (with the share of p's mass the soft labels keep).
A run whose loss or weights stop being finite raises DivergedError and writes no drafter: a
new run removes what it wrote to DIR, a resumed one keeps the earlier checkpoints.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..atomic import check_new_directory, new_directory, new_file
from .distill_data import (Batch, DataSpec, Pattern, Sequences, Teacher, build_sequences, make_batch,
                           read_tokens, split_limits)
from ..drafters.diffusion import NOISE_EPS, DiffusionDrafter, loglinear_sigma
from ..errors import DivergedError, UsageError
from ..loading import load_diffusion_drafter, load_target, pair_models
from ..nets.checkpoint import load_own, read_json, save_own
from ..nets.dit import DDiT, DiTConfig

MIN_LR = 0.1  # cosine decays to this share of the peak learning rate
MAX_WARMUP = 200
KEEP = 2  # checkpoints kept
VAL_EXAMPLES = 256
COND_DIM = 64
DEFAULT_SHAPE = {"layers": 2, "dim": 128, "heads": 4, "context": 32}
RAW_FRACTION = 0.25  # default share of raw text rows when --raw-text is given
MAX_GRAD_NORM = 1.0
CHAT_PROMPT_TOKENS = 96


@dataclass(frozen=True)
class DistillConfig:
    target: str
    out: str
    prompts: str
    chat: bool = False  # prompts: one question a line, through the target's chat template
    prompt_tokens: int | None = None  # chat: prompts left-padded to this length (default CHAT_PROMPT_TOKENS)
    data: str | None = None  # the teacher data cache (default OUT/data); runs with equal data settings may share it
    data_only: bool = False  # build the teacher data cache, then stop (no drafter)
    from_target: bool = False  # a new drafter of the target's width that reads and writes through the target's
    # own (frozen) token embedding and output head, so that it starts from what the target knows of tokens
    drafter: str | None = None  # an existing drafter to start from, else a new one of this shape:
    layers: int | None = None
    dim: int | None = None
    heads: int | None = None
    context: int | None = None
    mask_token: str | None = None  # a token of the tokenizer to use as mask id (else an extra row)
    raw_text: str | None = None
    raw_fraction: float | None = None
    gamma: int = 8
    steps_per_draft: int = 4
    num_prompts: int = 512
    continuation_tokens: int = 64
    teacher_temperature: tuple[float, ...] = (0.0,)  # one teacher setting per entry, chunks alternate
    teacher_top_p: tuple[float, ...] = (1.0,)  # one entry for all settings, or one per setting
    samples_per_prompt: int = 1
    soft_labels: int = 0  # k of the target's top-k distribution kept per position (kl needs it)
    draft_temperature: float = 1.0  # the drafter's softmax temperature in the streak losses
    eval_temperature: float = 1.0  # tau / alpha are measured greedy and at this temperature
    batch_size: int = 32
    lr: float = 5e-4
    max_steps: int = 1000
    time_budget: float | None = None  # seconds of training in this run
    val_every: int = 100
    checkpoint_every: int = 200
    eval_prompts: int = 8
    loss: str = "ce"
    resume: bool = False
    seed: int = 0
    device: str = "cpu"


def draft_logits(drafter: DiffusionDrafter, xt: torch.Tensor, n: int) -> torch.Tensor:
    """xt (B, n + gamma) -> x0 logits of the draft slots over the real vocabulary (B, gamma, V),
    fp32, differentiable; at masked slots equal (up to a per-row constant) to drafter.x0_logits."""
    sigma = loglinear_sigma((xt == drafter.mask_id).float().mean(dim=1))  # (B,)
    logits = drafter(xt, sigma, last=xt.shape[1] - n)[..., :drafter.vocab_size].float()
    if drafter.mask_id < drafter.vocab_size:
        logits = logits.index_fill(-1, torch.tensor([drafter.mask_id], device=logits.device), float("-inf"))
    return logits


@dataclass(frozen=True)
class Slots:
    """One batch's draft slots as every loss reads them: the drafter runs once per batch, also
    for a sum of losses."""

    logits: torch.Tensor  # (B, gamma, V) x0 logits, fp32, differentiable (draft_logits)
    x0: torch.Tensor  # (B, gamma) the teacher's tokens
    scored: torch.Tensor  # (B, gamma) bool: masked slots whose clean token is not the mask id
    t: torch.Tensor  # (B,) the fraction of each row masked
    width: int  # n + gamma positions per row
    soft_ids: torch.Tensor | None = None  # (B, gamma, k)
    soft_p: torch.Tensor | None = None  # (B, gamma, k)


def slots(drafter: DiffusionDrafter, batch: Batch) -> Slots:
    """Run the drafter on the batch -> its Slots."""
    x0 = batch.x0[:, batch.n:]
    scored = (batch.xt[:, batch.n:] == drafter.mask_id) & (x0 != drafter.mask_id)
    t = (batch.xt == drafter.mask_id).float().mean(dim=1)
    return Slots(draft_logits(drafter, batch.xt, batch.n), x0, scored, t, batch.xt.shape[1],
                 batch.soft_ids, batch.soft_p)


def _slot_ce(s: Slots) -> torch.Tensor:
    """CE at each draft slot (B, gamma), zero where not scored."""
    return F.cross_entropy(s.logits.transpose(1, 2), s.x0.masked_fill(~s.scored, -100), reduction="none")


def masked_ce(s: Slots) -> torch.Tensor:
    return _slot_ce(s).sum() / s.scored.sum().clamp(min=1)


def mdlm_elbo(s: Slots) -> torch.Tensor:
    weight = (1 - NOISE_EPS) / (1 - (1 - NOISE_EPS) * s.t) / torch.expm1(loglinear_sigma(s.t))  # (B,)
    return (weight[:, None] * _slot_ce(s)).sum(dim=1).mean() / s.width


def soft_kl(s: Slots) -> torch.Tensor:
    """KL(p || q) per scored slot, averaged, over k + 1 bins: the soft labels' ids and the rest
    of the vocabulary as one bin (p's rest = 1 - the mass kept; q's = its mass elsewhere), so
    that q keeps p's tail mass instead of piling it on the top k."""
    if s.soft_ids is None or s.soft_p is None:
        raise UsageError("the kl loss needs soft labels (`soft_labels` > 0)")
    log_q_all = s.logits.log_softmax(-1)  # (B, gamma, V)
    kept = s.soft_p > 0  # ids with mass (a raw text row's one-hot has repeated ids at p = 0)
    log_q = log_q_all.gather(-1, s.soft_ids)  # (B, gamma, k)
    elsewhere = log_q_all.scatter(-1, s.soft_ids.where(kept, s.soft_ids[..., :1]), float("-inf"))
    p_rest = (1 - s.soft_p.sum(-1)).clamp(min=0)  # (B, gamma)
    kl = (torch.xlogy(s.soft_p, s.soft_p) - s.soft_p * log_q).sum(-1) \
        + torch.xlogy(p_rest, p_rest) - p_rest * elsewhere.logsumexp(-1).clamp(min=-1e4)
    return (kl * s.scored).sum() / s.scored.sum().clamp(min=1)


def expected_streak(log_q: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """log q_i (B, gamma), 0 where not scored; scored (B, gamma) -> sum over scored m of
    c_m = prod_{i <= m} q_i (B,): the expected accepted length if slot i is accepted with q_i."""
    return (log_q.cumsum(1).exp() * scored).sum(1)


def reach_weighted_log_q(log_q: torch.Tensor) -> torch.Tensor:
    """log q_i (B, gamma) -> sum_j w_j log q_j (B,), w_1 = 1, w_j = c_{j-1} held constant."""
    log_reach = F.pad(log_q.cumsum(1)[:, :-1], (1, 0))  # log c_{j-1}, 0 for the first slot
    return (log_reach.detach().exp() * log_q).sum(1)


def _streak_log_q(s: Slots, temperature: float) -> torch.Tensor:
    """log q_i of the teacher token at each draft slot at the drafter's temperature (B, gamma),
    0 where not scored."""
    log_q = (s.logits / temperature).log_softmax(-1).gather(-1, s.x0[..., None])[..., 0]
    return log_q.masked_fill(~s.scored, 0)


def streak(s: Slots, temperature: float = 1.0) -> torch.Tensor:
    return -expected_streak(_streak_log_q(s, temperature), s.scored).mean()


def ce_streak(s: Slots, temperature: float = 1.0) -> torch.Tensor:
    return -reach_weighted_log_q(_streak_log_q(s, temperature)).mean()


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"ce": masked_ce, "mdlm": mdlm_elbo, "kl": soft_kl, "streak": streak, "ce-streak": ce_streak}
AT_DRAFT_TEMPERATURE = ("streak", "ce-streak")


def loss_function(cfg: DistillConfig) -> Callable[[DiffusionDrafter, Batch], torch.Tensor]:
    """The configured loss, with the deployment temperature where it takes one; "a+b" is the
    sum of losses a and b (e.g. ce+kl: the hard labels' argmax and the soft labels' spread),
    over one drafter pass."""
    parts = [partial(LOSSES[name], temperature=cfg.draft_temperature) if name in AT_DRAFT_TEMPERATURE
             else LOSSES[name] for name in cfg.loss.split("+")]

    def loss(drafter: DiffusionDrafter, batch: Batch) -> torch.Tensor:
        s = slots(drafter, batch)
        return torch.stack([part(s) for part in parts]).sum()
    return loss


def learning_rate(step: int, peak: float, max_steps: int) -> float:
    """Linear warmup over min(MAX_WARMUP, max_steps / 10) steps, then cosine down to MIN_LR * peak."""
    warmup = max(1, min(MAX_WARMUP, max_steps // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return peak * (MIN_LR + (1 - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    train_s: float = 0.0
    history: list = field(default_factory=list)  # [step, val loss]
    rng: torch.Tensor | None = None  # state of the batch generator: the data position


def _check(cfg: DistillConfig) -> None:
    for name in ("gamma", "steps_per_draft", "num_prompts", "continuation_tokens", "batch_size",
                 "max_steps", "val_every", "checkpoint_every", "eval_prompts", "samples_per_prompt"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"`{name}` must be >= 1, got {getattr(cfg, name)}")
    if any(name not in LOSSES for name in cfg.loss.split("+")):
        raise UsageError(f"unknown loss '{cfg.loss}' (choose from {', '.join(LOSSES)}, or a sum such as ce+kl)")
    _check_finite(cfg)
    if cfg.lr <= 0 or cfg.draft_temperature <= 0 or (cfg.time_budget is not None and cfg.time_budget <= 0):
        raise UsageError("lr, draft_temperature and time_budget must be > 0")
    _check_teacher(cfg)
    if cfg.soft_labels < 0 or ("kl" in cfg.loss.split("+") and cfg.soft_labels == 0):
        raise UsageError(f"`soft_labels` must be >= 0, and > 0 (e.g. 32) for the kl loss; got {cfg.soft_labels}")
    if cfg.raw_fraction is not None and (cfg.raw_text is None or not 0 <= cfg.raw_fraction <= 1):
        raise UsageError("`raw_fraction` needs `raw_text` and must lie in [0, 1]")
    if cfg.prompt_tokens is not None and (not cfg.chat or cfg.prompt_tokens < 1):
        raise UsageError(f"`prompt_tokens` needs `chat` and must be >= 1, got {cfg.prompt_tokens}")
    if cfg.continuation_tokens < cfg.gamma:
        raise UsageError(f"`continuation_tokens` ({cfg.continuation_tokens}) must be >= `gamma` ({cfg.gamma})")
    for name in DEFAULT_SHAPE:  # given: used as given (0 once became the default silently)
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise UsageError(f"`{name}` must be >= 1, got {getattr(cfg, name)}")
    if cfg.drafter and any(getattr(cfg, k) is not None for k in DEFAULT_SHAPE):
        raise UsageError("`drafter` fixes the architecture: drop `layers` / `dim` / `heads` / `context`")
    out = Path(cfg.out)
    if not cfg.resume and not cfg.data_only:
        check_new_directory(out)


def _check_teacher(cfg: DistillConfig) -> None:
    temperatures, top_ps = cfg.teacher_temperature, cfg.teacher_top_p
    if not temperatures or len(top_ps) not in (1, len(temperatures)):
        raise UsageError(f"`teacher_top_p` needs one value or one per `teacher_temperature` ({len(temperatures)})")
    if min(temperatures) < 0 or cfg.eval_temperature < 0:
        raise UsageError("`teacher_temperature` and `eval_temperature` must be >= 0 (0 = greedy)")
    if not all(0 < p <= 1 for p in top_ps):
        raise UsageError(f"`teacher_top_p` must lie in (0, 1], got {', '.join(map(str, top_ps))}")


def _mask_id(tokenizer: Any, mask_token: str | None) -> int:
    if mask_token is None:
        return len(tokenizer)
    vocab = tokenizer.get_vocab()
    if mask_token not in vocab:
        raise UsageError(f"`mask_token` {mask_token!r} is not a token of the target's tokenizer")
    return vocab[mask_token]


def _new_drafter(cfg: DistillConfig, tokenizer: Any) -> DiffusionDrafter:
    shape = {k: getattr(cfg, k) or v for k, v in DEFAULT_SHAPE.items()}
    if min(shape.values()) < 1:
        raise UsageError(f"`layers`, `dim`, `heads` and `context` must be >= 1, got {shape}")
    vocab, mask_id = len(tokenizer), _mask_id(tokenizer, cfg.mask_token)
    try:
        dit = DiTConfig(vocab_size=max(vocab, mask_id + 1), hidden_size=shape["dim"], n_heads=shape["heads"],
                        n_blocks=shape["layers"], cond_dim=COND_DIM, time_conditioning=False)
    except ValueError as e:
        raise UsageError(str(e)) from e
    backbone = DDiT(dit).init_random(torch.Generator().manual_seed(cfg.seed))
    return DiffusionDrafter(backbone, vocab_size=vocab, mask_id=mask_id, context_length=shape["context"],
                            parameterization="subs", tokenizer=tokenizer, source=cfg.out)


def _share_target_embeddings(drafter: DiffusionDrafter, target: Teacher) -> DiffusionDrafter:
    """A new drafter reads and writes through the target's input embedding and output head
    (rows 0..V-1; the mask row keeps its random vector, scaled like the target's rows)."""
    embed = target.model.get_input_embeddings().weight.detach()  # (V_t, h)
    if embed.shape[1] != drafter.config.hidden_size:
        raise UsageError(f"`from_target` needs `dim` = the target's hidden size {embed.shape[1]}")
    with torch.no_grad():
        rest = drafter.backbone.vocab_embed.embedding[drafter.vocab_size:]
        rest.mul_(embed.norm(dim=1).mean() / rest.norm(dim=1, keepdim=True).clamp_min(1e-6))
    drafter.target_embeddings = True
    pair_models(target, drafter)
    return drafter


def _frozen(drafter: DiffusionDrafter) -> DiffusionDrafter:
    """The rows a drafter shares with its target stay frozen (also after a resume: its checkpoints
    record `target_embeddings`): it learns only what lies between them."""
    if drafter.target_embeddings:
        drafter.backbone.vocab_embed.embedding.requires_grad_(False)
        drafter.backbone.output_layer.linear.weight.requires_grad_(False)
    return drafter


def _initial_drafter(cfg: DistillConfig, target: Teacher) -> DiffusionDrafter:
    if cfg.drafter is None and cfg.from_target:
        return _share_target_embeddings(_new_drafter(cfg, target.tokenizer), target)
    if cfg.drafter is None:
        return _new_drafter(cfg, target.tokenizer)
    drafter = load_diffusion_drafter(cfg.drafter)
    pair_models(target, drafter)
    if cfg.mask_token is not None and _mask_id(target.tokenizer, cfg.mask_token) != drafter.mask_id:
        raise UsageError(f"`mask_token` {cfg.mask_token!r} is not the mask id of {cfg.drafter} ({drafter.mask_id})")
    drafter.tokenizer = target.tokenizer
    return drafter


def _check_finite(cfg: DistillConfig) -> None:
    """Every float option is a finite number: nan passes every comparison, inf makes no sense."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        values = value if f.type == "tuple[float, ...]" else (value,)
        if f.type in ("float", "float | None", "tuple[float, ...]") and value is not None:
            for v in values:
                if not math.isfinite(v):
                    raise UsageError(f"{f.name} must be a finite number, got {v}")


def _check_loss(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise DivergedError(f"training diverged at step {step} (loss {loss}); no drafter written (try a lower lr)")


def _check_weights(drafter: DiffusionDrafter, step: int) -> None:
    """Before anything is saved: an update can leave non-finite weights after a finite loss."""
    if not all(torch.isfinite(p).all() for p in drafter.parameters()):
        raise DivergedError(f"training diverged at step {step} (non-finite weights); no drafter written "
                            "(try a lower lr)")


@contextmanager
def _undone_if_diverged(out: Path) -> Iterator[None]:
    """A run into an absent or empty DIR that diverges leaves DIR as it found it; a resumed run
    keeps its earlier checkpoints (only finite weights are ever saved)."""
    existed = out.exists()
    fresh = not existed or not any(out.iterdir())
    try:
        yield
    except DivergedError:
        if fresh:
            shutil.rmtree(out, ignore_errors=True)
            if existed:
                out.mkdir()
        raise


def _latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step-*") if (p / "state.pt").is_file())
    return done[-1] if done else None


def _save_checkpoint(root: Path, drafter: DiffusionDrafter, opt: torch.optim.Optimizer, state: TrainState) -> None:
    path = root / f"step-{state.step:07d}"
    if path.exists():
        return
    _check_weights(drafter, state.step)
    with new_directory(path) as tmp:
        _save_drafter(tmp, drafter, tokenizer=None)
        torch.save({"optimizer": opt.state_dict(), **asdict(state)}, tmp / "state.pt")
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        shutil.rmtree(old)


def _load_checkpoint(path: Path, target: Teacher) -> tuple[DiffusionDrafter, dict, TrainState]:
    backbone, fields = load_own(path, read_json(path / "config.json"))
    drafter = DiffusionDrafter(backbone, tokenizer=target.tokenizer, source=str(path), **fields)
    pair_models(target, drafter)
    saved = torch.load(path / "state.pt", weights_only=True)
    return drafter, saved.pop("optimizer"), TrainState(**saved)


def _save_drafter(directory: Path, drafter: DiffusionDrafter, tokenizer: Any) -> None:
    save_own(directory, drafter.backbone, vocab_size=drafter.vocab_size, mask_id=drafter.mask_id,
             context_length=drafter.context_length, parameterization=drafter.parameterization,
             tokenizer=tokenizer, defaults=drafter.defaults, target_embeddings=drafter.target_embeddings)


def trained_for(cfg: DistillConfig) -> dict:
    """The draft settings a run trains for, recorded in the drafter's config.json: its examples
    are gamma slots masked as the l2r schedule with T = steps_per_draft masks them."""
    return {"gamma": cfg.gamma, "steps": cfg.steps_per_draft, "schedule": "l2r"}


def _publish(out: Path, drafter: DiffusionDrafter, tokenizer: Any) -> None:
    """Write the drafter's files into `out`, config.json last (a drafter once it exists)."""
    (out / "config.json").unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".drafter-", dir=out))
    try:
        _save_drafter(tmp, drafter, tokenizer)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
            f.replace(out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@torch.no_grad()
def validation_loss(drafter: DiffusionDrafter, batches: list[Batch], cfg: DistillConfig) -> float:
    drafter.eval()
    loss = loss_function(cfg)
    values = [loss(drafter, b.to(cfg.device)).item() for b in batches]
    drafter.train()
    return round(sum(values) / len(values), 5)


def _step(drafter: DiffusionDrafter, opt: torch.optim.Optimizer, batch: Batch, lr: float, cfg: DistillConfig) -> float:
    """One optimizer step -> the batch's loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = loss_function(cfg)(drafter, batch.to(cfg.device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), MAX_GRAD_NORM)
    opt.step()
    return loss.item()


def _train(drafter: DiffusionDrafter, opt: torch.optim.Optimizer, state: TrainState, cfg: DistillConfig, data: Data,
           progress: bool) -> None:
    """Steps until max_steps or the time budget; validation and checkpoints on the way."""
    generator = torch.Generator().manual_seed(cfg.seed)
    if state.rng is not None:
        generator.set_state(state.rng)
    root, last = Path(cfg.out) / "checkpoints", time.perf_counter()
    deadline = last + (cfg.time_budget if cfg.time_budget is not None else math.inf)
    bar = tqdm(total=cfg.max_steps, initial=state.step, disable=not progress, unit="step", desc="distill")
    drafter.train()
    while state.step < cfg.max_steps and time.perf_counter() < deadline:
        batch = make_batch(data.train, data.pattern, cfg.batch_size, generator, data.prompt_tokens,
                           data.raw, data.raw_fraction, limits=data.limits)
        loss = _step(drafter, opt, batch, learning_rate(state.step, cfg.lr, cfg.max_steps), cfg)
        _check_loss(loss, state.step + 1)
        state.step, state.tokens, state.rng = state.step + 1, state.tokens + batch.x0.numel(), generator.get_state()
        if state.step % cfg.val_every == 0 or state.step == cfg.max_steps:
            state.history.append([state.step, validation_loss(drafter, data.val_batches, cfg)])
            if not progress:  # no bar: one line per validation, so a log shows the run is alive
                print(f"distill: step {state.step}/{cfg.max_steps}, loss {loss:.4f}, "
                      f"val {state.history[-1][1]:.4f}", file=sys.stderr, flush=True)
        if state.step % cfg.checkpoint_every == 0:
            state.train_s, last = state.train_s + time.perf_counter() - last, time.perf_counter()
            _save_checkpoint(root, drafter, opt, state)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.update()
    bar.close()
    state.train_s += time.perf_counter() - last
    if state.history[-1][0] != state.step:
        state.history.append([state.step, validation_loss(drafter, data.val_batches, cfg)])
    _save_checkpoint(root, drafter, opt, state)


@dataclass
class Data:
    train: Sequences  # (M, P + L) prompts and the target's continuations, soft labels
    val: Sequences  # (M_val, P + L) held-out
    val_batches: list[Batch]  # fixed validation examples
    pattern: Pattern
    raw: torch.Tensor | None  # raw text tokens (n,)
    raw_fraction: float
    generate_s: float
    generated_tokens: int
    prompt_tokens: int  # P: the continuation starts at this column
    limits: torch.Tensor | None  # (M,) per-row split limits (chat: nothing past the answer's end)


def _prepare(cfg: DistillConfig, target: Teacher, drafter: DiffusionDrafter, progress: bool) -> Data:
    """Sequences, raw text, the drafting pattern and the fixed validation batches."""
    N, L = drafter.context_length, cfg.continuation_tokens
    P = (cfg.prompt_tokens or CHAT_PROMPT_TOKENS) if cfg.chat else N
    if P + L > target.max_length:
        raise UsageError(f"prompts of {P} tokens plus `continuation_tokens` {L} "
                         f"exceed the target's context window ({target.max_length})")
    banned = drafter.mask_id if drafter.mask_id < target.vocab_size else None
    spec = DataSpec(target.name, str(Path(cfg.prompts).resolve()), P, L, cfg.num_prompts,
                    max(2, min(64, cfg.num_prompts // 8)), list(cfg.teacher_temperature),
                    list(cfg.teacher_top_p), cfg.samples_per_prompt, cfg.soft_labels, cfg.seed, banned, cfg.chat)
    raw = read_tokens(cfg.raw_text, target.tokenizer, "raw text") if cfg.raw_text else None
    if raw is not None and len(raw) < P + cfg.gamma:
        raise UsageError(f"{cfg.raw_text} has {len(raw)} tokens; it needs at least {P + cfg.gamma}")
    train, val, generate_s = build_sequences(data_directory(cfg), target, spec, progress)
    pattern = Pattern(N, cfg.gamma, cfg.steps_per_draft, drafter.mask_id)
    eos = target.eos_token_id if cfg.chat else None
    g = torch.Generator().manual_seed(cfg.seed + 1)
    val_limits = split_limits(val, P, cfg.gamma, eos)
    val_batches = [make_batch(val, pattern, cfg.batch_size, g, P, context=N, limits=val_limits)
                   for _ in range(-(-VAL_EXAMPLES // cfg.batch_size))]
    fraction = 0.0 if raw is None else RAW_FRACTION if cfg.raw_fraction is None else cfg.raw_fraction
    return Data(train, val, val_batches, pattern, raw, fraction, generate_s, (len(train) + len(val)) * L,
                P, split_limits(train, P, cfg.gamma, eos))


def evaluate_drafter(cfg: DistillConfig, target: Teacher, drafter: DiffusionDrafter, val: Sequences, P: int) -> dict:
    """tau and alpha of specdiff (l2r, T steps) against the target on held-out prompts (distinct
    prompts: the S samples of one share it), greedy and at eval_temperature (seed cfg.seed)."""
    from ..generation import generate

    prompts = list(val.ids[::cfg.samples_per_prompt, :P])
    if cfg.chat:  # templated questions, left-padded: drop the padding, keep the template's tokens
        fill = target.tokenizer.pad_token_id
        prompts = [row[int((row != fill).float().argmax()):] for row in prompts]
    texts = [t for t in target.tokenizer.batch_decode(prompts) if t.strip()][:cfg.eval_prompts]
    drafter.eval()
    report: dict = {"prompts": len(texts), "max_new_tokens": cfg.continuation_tokens}
    for key, temperature in (("greedy", 0.0), ("sampled", cfg.eval_temperature)):
        m = generate(texts, target=target, drafter=drafter, method="specdiff", gamma=cfg.gamma,
                     steps=cfg.steps_per_draft, schedule="l2r", temperature=temperature,
                     max_new_tokens=cfg.continuation_tokens, seed=cfg.seed).metrics
        report[key] = {"temperature": temperature, "tau": round(m.tau, 4),
                       "alpha": None if m.alpha is None else round(m.alpha, 4),
                       "per_position_acceptance": m.to_dict()["per_position_acceptance"]}
    return report


def _soft_label_report(cfg: DistillConfig, data: Data) -> dict | None:
    """How much of p the soft labels keep: the mean over positions of their summed probability."""
    if data.train.soft_p is None:
        return None
    mass = data.train.soft_p.float().sum(-1)  # (M, L)
    return {"k": cfg.soft_labels, "mass_kept": {"mean": round(mass.mean().item(), 4),
                                                "p10": round(mass.quantile(0.1).item(), 4)}}


def data_directory(cfg: DistillConfig) -> Path:
    return Path(cfg.data) if cfg.data else Path(cfg.out) / "data"


def build_data(cfg: DistillConfig, target: Teacher, progress: bool) -> dict:
    """data_only: the teacher data cache alone -> a short report."""
    data = _prepare(cfg, target, _initial_drafter(cfg, target), progress)
    return {"target": target.name, "data": str(data_directory(cfg)), "generated_tokens": data.generated_tokens,
            "generate_s": round(data.generate_s, 3), "sequences": len(data.train) + len(data.val)}


def distill(cfg: DistillConfig, progress: bool = False) -> dict:
    """Train a drafter for cfg.target into cfg.out (see the module docstring) -> the report."""
    wall = time.perf_counter()
    _check(cfg)
    target = load_target(cfg.target, device=cfg.device, dtype="fp32")
    if cfg.data_only:
        return build_data(cfg, target, progress)
    out = Path(cfg.out)
    latest = _latest_checkpoint(out / "checkpoints") if cfg.resume else None
    drafter, opt_state, state = (_load_checkpoint(latest, target) if latest
                                 else (_initial_drafter(cfg, target), None, TrainState()))
    _frozen(drafter).to(cfg.device)
    drafter.defaults = trained_for(cfg)
    with _undone_if_diverged(out):
        data = _prepare(cfg, target, drafter, progress)
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        if not state.history:
            state.history.append([0, validation_loss(drafter, data.val_batches, cfg)])
        _train(drafter, opt, state, cfg, data, progress)
    _publish(out, drafter, target.tokenizer)
    report = {
        "target": target.name, "drafter": str(out), "loss": cfg.loss, "draft_temperature": cfg.draft_temperature,
        "teacher": {"temperature": list(cfg.teacher_temperature), "top_p": list(cfg.teacher_top_p),
                    "samples_per_prompt": cfg.samples_per_prompt},
        "soft_labels": _soft_label_report(cfg, data), "gamma": cfg.gamma,
        "steps_per_draft": cfg.steps_per_draft, "context_length": drafter.context_length,
        "mask_id": drafter.mask_id, "vocab_size": drafter.vocab_size,
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "val_loss": {"initial": state.history[0][1], "final": state.history[-1][1], "history": state.history},
        "eval": evaluate_drafter(cfg, target, drafter, data.val, data.prompt_tokens),
        "compute": {"steps": state.step, "train_tokens": state.tokens, "train_s": round(state.train_s, 3),
                    "generated_tokens": data.generated_tokens, "generate_s": round(data.generate_s, 3),
                    "wall_s": round(time.perf_counter() - wall, 3), "device": cfg.device,
                    "threads": torch.get_num_threads()},
    }
    with new_file(out / "report.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
