"""Block-diffusion targets (SDAR layout): native loading into transformers' Qwen3, `block` against
a plain no-cache reference written here, `simsd-exact` token-identical to `block` for every
remasking rule whatever the draft, and bad input as one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from scipy.stats import chisquare
from transformers import Qwen3Config, Qwen3ForCausalLM

from specdiff import generate
from specdiff.block_decoding import StepNoise, transition
from specdiff.settings import BlockSettings
from specdiff.errors import LoadError
from specdiff.loading import load_target
from specdiff.sampling import Sampling
from specdiff_cli.main import cli
from tiny import make_tokenizer

MASK = "<|mask|>"
PROMPTS = ["To be, or not", "The quick brown fox jumps over the lazy dog. A journey"]  # partial / other blocks
# block equals the no-cache reference written here, simsd-exact equals block (tests/test_methods.py)
IDENTITY_TESTED = ("block", "simsd-exact")


def make_sdar(directory: Path, tokenizer, *, block_size: int = 4, layers: int = 2, dim: int = 32,
              seed: int = 0, scale: float = 8.0) -> Path:
    """A random SDAR-layout checkpoint written by hand: Qwen3 parameter names, an untied head
    (scaled for peaked distributions), config.json with model_type sdar, block_size,
    mask_token_id and an auto_map to modeling code that is not there."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=dim, intermediate_size=2 * dim,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=dim // 2, max_position_embeddings=128, tie_word_embeddings=False,
                         bos_token_id=eos, eos_token_id=eos)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    directory.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    fields = {**config.to_diff_dict(), "model_type": "sdar", "architectures": ["SDARForCausalLM"],
              "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig",
                           "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
              "block_size": block_size, "mask_token_id": tokenizer.convert_tokens_to_ids(MASK)}
    (directory / "config.json").write_text(json.dumps(fields))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdar")
    tok = make_tokenizer(root / "tokenizer", vocab_size=300)
    tok.add_special_tokens({"additional_special_tokens": [MASK]})
    return {"target": make_sdar(root / "target", tok), "drafter": make_sdar(root / "drafter", tok, layers=1, seed=5),
            "b2": make_sdar(root / "b2", tok, block_size=2, layers=1, seed=6), "tokenizer": tok, "root": root}


def test_sdar_loads_into_qwen3_without_remote_code(sdar):
    target = load_target(str(sdar["target"]))
    assert type(target.model).__name__ == "Qwen3ForCausalLM"
    assert (target.block_size, target.mask_id) == (4, sdar["tokenizer"].convert_tokens_to_ids(MASK))
    assert target.vocab_size == len(sdar["tokenizer"])


def test_a_missing_tensor_is_one_load_error(sdar, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in sdar["target"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    from safetensors.torch import load_file
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.0.self_attn.q_norm.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(LoadError, match="missing model.layers.0.self_attn.q_norm.weight"):
        load_target(str(broken))


@pytest.mark.parametrize("change, message", [
    ({"mask_token_id": 10**6}, "mask_token_id 1000000 is not an id of the embedding (vocab_size 301)"),  # IndexError
    ({"mask_token_id": True}, "an SDAR config needs block_size >= 1 and mask_token_id, got 4 and True"),
    ({"block_size": 10**6}, "block_size 1000000 is longer than max_position_embeddings 128"),  # a 1 TB allocation
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer >= 1, got 0"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 2"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be an integer >= 1, got 0"),
    ({"hidden_size": "x"}, "not a Qwen3-shaped SDAR config (Validation error for field 'hidden_size'"),
    ({"num_hidden_layers": 0}, "not a Qwen3-shaped SDAR config"),
])
def test_sdar_config_values_out_of_range_are_one_load_error(sdar, tmp_path, change, message):
    broken = tmp_path / "broken"
    for f in sdar["target"].iterdir():
        (broken / f.name).parent.mkdir(exist_ok=True)
        (broken / f.name).write_bytes(f.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(LoadError) as info:
        load_target(str(broken))
    assert message in str(info.value) and "\n" not in str(info.value)


# --- an independent reference: no cache, the whole sequence through the model at every step ---

@torch.no_grad()
def reference_block_decoding(model, prompt: list[int], B: int, S: int, mask_id: int, eos: int, max_new: int,
                             rule: str, threshold: float, vocab: int, noise=None) -> list[int]:
    """Vanilla block decoding written plainly: every step runs the whole sequence (finished
    blocks + the current block) with a block-causal mask; slots chosen as the SDAR rules say."""
    seq = list(prompt)
    start = len(prompt) // B * B
    while True:
        block = seq[start:] + [mask_id] * (B - (len(seq) - start))
        seq = seq[:start]
        for step in range(S):
            masked = [i for i in range(B) if block[i] == mask_id]
            if not masked:
                break
            ids = torch.tensor([seq + block])
            n = ids.shape[1]
            blocks = torch.arange(n) // B
            allowed = blocks[:, None] >= blocks[None, :]
            mask = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
            logits = model(input_ids=ids, attention_mask=mask[None, None],
                           position_ids=torch.arange(n)[None]).logits[0, start:, :vocab].float()
            logits[:, mask_id] = -math.inf
            probs = logits.softmax(-1)
            if noise is None:
                x0 = logits.argmax(-1)
            else:
                x0 = (probs.log() + noise(start, step, tuple(probs.shape))).argmax(-1)
            conf = [float(probs[i, x0[i]]) for i in range(B)]
            quota = -(-len(masked) // (S - step))
            by_conf = sorted(masked, key=lambda i: (-conf[i], i))
            if rule == "sequential":
                chosen = masked[:quota]
            elif rule == "dynamic" and sum(conf[i] > threshold for i in masked) >= quota:
                chosen = [i for i in masked if conf[i] > threshold]
            else:
                chosen = by_conf[:quota]
            for i in chosen:
                block[i] = int(x0[i])
        seq += block
        start += B
        new = seq[len(prompt):]
        if eos in new or len(new) >= max_new:
            cut = new.index(eos) + 1 if eos in new else max_new
            return new[:min(cut, max_new)]


def _generate(sdar, prompt, **kw):
    out = generate([prompt], target=str(sdar["target"]), max_new_tokens=kw.pop("max_new_tokens", 14), **kw)
    return out.outputs[0].tokens


@pytest.mark.parametrize("rule, steps, threshold", [("sequential", 4, 0.9), ("static", 2, 0.9),
                                                    ("dynamic", 4, 0.3), ("static", 4, 0.9)])
def test_block_matches_a_no_cache_reference(sdar, rule, steps, threshold):
    target = load_target(str(sdar["target"]))
    tok = sdar["tokenizer"]
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        expected = reference_block_decoding(target.model, ids, 4, steps, target.mask_id, target.eos_token_id, 14,
                                            rule, threshold, target.vocab_size)
        dynamic = {"threshold": threshold} if rule == "dynamic" else {}  # read by dynamic remasking only
        got = _generate(sdar, prompt, method="block", remasking=rule, steps=steps, **dynamic)
        assert got == expected, (prompt, rule)


def test_block_sampling_matches_the_reference_with_the_same_noise(sdar):
    target = load_target(str(sdar["target"]))
    ids = sdar["tokenizer"].encode(PROMPTS[0])
    noise = StepNoise(Sampling(1.0), torch.Generator().manual_seed(0), torch.device("cpu"))
    expected = reference_block_decoding(target.model, ids, 4, 4, target.mask_id, target.eos_token_id, 14,
                                        "static", 0.9, target.vocab_size, noise)
    assert _generate(sdar, PROMPTS[0], method="block", temperature=1.0) == expected


@pytest.mark.parametrize("rule", ["sequential", "static", "dynamic"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("draft", ["drafter", "target"])
def test_simsd_exact_is_block(sdar, rule, temperature, draft):
    """Whatever the draft (a different random model, or the target itself), every committed
    transition is the target's own: the output is block's, token for token."""
    kw = dict(remasking=rule, temperature=temperature, seed=3, max_new_tokens=20,
              **({"threshold": 0.3} if rule == "dynamic" else {}))
    for prompt in PROMPTS:
        reference = _generate(sdar, prompt, method="block", **kw)
        out = generate([prompt], target=str(sdar["target"]), drafter=str(sdar[draft]), method="simsd-exact", **kw)
        assert out.outputs[0].tokens == reference
        if draft == "target":  # a perfect draft: one target call per block (+ the prefill)
            assert out.metrics.alpha == 1.0


def test_transition_draws_from_p(sdar):
    """Gumbel-max over the warped p at a single masked slot (chi-square, 6 tokens); a variant that
    adds the noise to probabilities instead of log-probabilities fails the same test."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    sampling, settings = Sampling(1.0), BlockSettings("static", 1, 0.9, 1)
    p = logits.softmax(-1)[0]

    def pvalue(x0):
        counts = torch.bincount(x0, minlength=6).double()
        return chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue

    n = 20_000  # n independent slots, all masked, all committed in this one step
    noise = StepNoise(sampling, torch.Generator().manual_seed(1), torch.device("cpu"))(0, 0, (n, 6))
    block = torch.full((n,), 99)
    assert pvalue(transition(logits.expand(n, -1), block, 0, 99, sampling, settings, noise)) > 1e-3
    assert pvalue((p + noise).argmax(-1)) < 1e-8


def run_cli(args, input="To be\n"):
    return CliRunner().invoke(cli, ["generate", *args], input=input)


def test_stats_say_whether_the_method_is_exact(sdar):
    """--stats carries the registry's `exact`: simsd, the published approximate method, says so."""
    for method, exact in (("simsd-exact", True), ("simsd", False)):
        result = run_cli(["--target", str(sdar["target"]), "--drafter", str(sdar["drafter"]), "--method", method,
                          "--max-new-tokens", "4", "--stats"])
        assert result.exit_code == 0, result.output
        stats = json.loads(result.stderr.strip().splitlines()[-1])
        assert (stats["method"], stats["exact"]) == (method, exact)


@pytest.mark.parametrize("args, message", [
    (["--target", "{causal}", "--method", "block"], "method 'block' needs a block-diffusion target"),
    (["--target", "{target}", "--method", "ar"], "method 'ar' needs a causal LM target"),
    (["--target", "{target}", "--steps", "5"], "--steps 5 is more than the block size 4"),
    (["--target", "{target}", "--drafter", "{b2}", "--method", "simsd-exact"], "block size / mask id 2"),
    (["--target", "{target}", "--method", "simsd-exact"], "needs a block-diffusion drafter (--drafter)"),
    (["--target", "{target}", "--remasking", "dynamic", "--threshold", "2"], "--threshold must lie in [0, 1]"),
    (["--target", "{target}", "--threshold", "0.5"], "--threshold is read by --remasking dynamic only, not static"),
    (["--target", "{target}", "--schedule", "confidence"], "method 'block' does not use --schedule"),
    (["--target", "{target}", "--drafter", "{drafter}", "--method", "simsd", "--steps", "2"],
     "method 'simsd' does not use --steps; it reads none of the draft settings"),
    (["--target", "{target}", "--drafter", "{drafter}", "--method", "simsd-exact", "--gamma", "auto"],
     "method 'simsd-exact' does not choose its draft length: --gamma auto needs spec-ar, specdiff, dflash or eagle3; give an "
     "integer --gamma"),
])
def test_bad_input_is_one_line(sdar, tiny, args, message):
    paths = {k: str(v) for k, v in sdar.items() if isinstance(v, Path)} | {"causal": str(tiny.gpt2)}
    result = run_cli([a.format(**paths) for a in args])
    assert result.exit_code == (1 if "mask id" in message else 2), result.output  # 1: models incompatible
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_a_verifier_that_trusts_the_draft_fails_the_same_check(sdar, monkeypatch):
    """The check above can fail: committing the draft's trajectory unverified changes the output."""
    import specdiff.block_decoding as bd

    def trusting(target, run, states, sampling, settings, noise):
        run.block, run.step = states[-1], run.step + len(states) - 1
        return len(states) - 1, False
    monkeypatch.setattr(bd, "_verify", trusting)
    kw = dict(max_new_tokens=20)
    reference = _generate(sdar, PROMPTS[1], method="block", **kw)
    out = generate([PROMPTS[1]], target=str(sdar["target"]), drafter=str(sdar["drafter"]), method="simsd-exact", **kw)
    assert out.outputs[0].tokens != reference


def test_temporal_mask_is_simsds_table():
    from specdiff.simsd import temporal_mask

    n_left, t = 2, torch.tensor([2, 1, 3])
    n = len(t)
    got = temporal_mask(n_left, t)
    kind = ["left"] * n_left + ["draft"] * n + ["copy"] * n
    step = [0] * n_left + t.tolist() * 2
    for i in range(n_left + 2 * n):
        for j in range(n_left + 2 * n):
            q, k, ti, tj = kind[i], kind[j], step[i], step[j]
            want = (k == "left" if q == "left" else k == "left" or
                    (tj <= ti if k == "draft" else tj > ti) if q == "draft" else
                    k == "left" or (tj < ti if k == "draft" else tj >= ti))
            assert bool(got[i, j]) == want, (i, j)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_simsd_runs_and_its_agreement_with_block_is_measured(sdar, temperature):
    """simsd is approximate: it runs, emits tokens, and is not claimed to equal block."""
    kw = dict(temperature=temperature, max_new_tokens=16)
    out = generate(PROMPTS, target=str(sdar["target"]), drafter=str(sdar["drafter"]), method="simsd", **kw)
    reference = generate(PROMPTS, target=str(sdar["target"]), method="block", **kw)
    assert all(len(o.tokens) == 16 or o.metrics.stop_reason == "eos" for o in out.outputs)
    agree = [sum(a == b for a, b in zip(o.tokens, r.tokens)) / len(r.tokens)
             for o, r in zip(out.outputs, reference.outputs)]
    assert all(0 <= a <= 1 for a in agree) and out.metrics.target_calls > 0


def test_bench_rows_block_simsd_exact_simsd(sdar, tmp_path):
    """`specdiff bench` on a block-diffusion target: the three rows; simsd-exact agrees with block
    on every prompt (--check would fail otherwise), simsd's agreement is reported."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    result = CliRunner().invoke(cli, ["bench", "--target", str(sdar["target"]), "--drafter", str(sdar["drafter"]),
                                      "--prompt-file", str(prompts), "--max-new-tokens", "12", "--repeats", "1",
                                      "--warmup", "0", "--out", str(tmp_path / "out"), "--check", "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]}
    assert set(rows) == {"block", "simsd-exact", "simsd"}
    assert rows["simsd-exact"]["agreement"] == 1.0 and rows["simsd-exact"]["identical_prompts"] == 2
    assert rows["block"]["tokens_per_target_call"] < 1  # S + 1 calls per block of B = S tokens
    assert 0 <= rows["simsd"]["agreement"] <= 1 and rows["simsd"]["exact"] is False
    report = json.loads((tmp_path / "out" / "bench.json").read_text())  # a causal target's shape
    assert report["check"] == {"greedy": True, "passed": True, "mismatched": []}
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["check"] is True and set(summary["speedup"]) == {r["label"] for r in report["rows"]}


def test_bench_check_fails_when_an_exact_block_method_differs(sdar, tmp_path, monkeypatch):
    """The check above can fail: simsd-exact committing its draft unverified differs from block."""
    import specdiff.block_decoding as bd

    def trusting(target, run, states, sampling, settings, noise):
        run.block, run.step = states[-1], run.step + len(states) - 1
        return len(states) - 1, False
    monkeypatch.setattr(bd, "_verify", trusting)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    result = CliRunner().invoke(cli, ["bench", "--target", str(sdar["target"]), "--drafter", str(sdar["drafter"]),
                                      "--methods", "block,simsd-exact", "--prompt-file", str(prompts),
                                      "--max-new-tokens", "20", "--repeats", "1", "--warmup", "0",
                                      "--out", str(tmp_path / "out"), "--check", "--no-plots"])
    assert result.exit_code == 1 and "greedy outputs differ from block: simsd-exact T=" in result.stderr, result.output
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["check"]["passed"] is False


def test_bench_on_a_block_target_refuses_the_sweeps_it_does_not_read(sdar, tmp_path):
    result = CliRunner().invoke(cli, ["bench", "--target", str(sdar["target"]), "--schedule", "confidence",
                                      "--acceptance", "greedy", "--out", str(tmp_path / "out"), "--no-plots"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "--schedule, --acceptance: not read on a block-diffusion target" in result.stderr
    assert not (tmp_path / "out").exists()


def test_remasking_names_without_torch_equal_the_rules():
    from specdiff import names
    from specdiff.block_decoding import REMASKING

    assert names.REMASKING == tuple(REMASKING)
