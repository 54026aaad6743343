"""What users of Hugging Face / vLLM expect, kept exact: stop strings cut every method where plain
decoding stops, a repetition penalty gives the same p as plain decoding (and as transformers'
own generate), chat templates shape the prompt. The sampling test with the penalty on is in
test_sampling_exact.py."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from specdiff import generate, load_drafter, load_target
from specdiff.errors import UsageError
from specdiff.generation import encode_prompts, plan
from specdiff.sampling import penalize, seen_tokens
from specdiff_cli.main import cli

from tiny import with_chat

PROMPTS = ["The quick brown fox", "To be, or not to be", "def main():", "It was the best of times"]
IDENTITY_TESTED = ("ar",)  # ar, the reference, equals transformers' own greedy generate (tests/test_methods.py)


@pytest.fixture(scope="module")
def models(tiny):
    return {"target": load_target(str(tiny.gpt2)), "drafter": load_drafter(str(tiny.drafter)),
            "ar": load_drafter(str(tiny.gpt2))}  # the target as its own AR drafter: long accepted runs


def _runs(models, **options):
    """The same request by ar, specdiff and spec-ar -> {method: GenerationResult}."""
    drafters = {"ar": None, "specdiff": models["drafter"], "spec-ar": models["ar"]}
    return {m: generate(PROMPTS, target=models["target"], drafter=d, method=m, max_new_tokens=24,
                        **({} if m == "ar" else {"gamma": 5}), **options) for m, d in drafters.items()}


def test_seen_tokens_and_penalty_match_transformers_per_prefix():
    g = torch.Generator().manual_seed(0)
    context, draft = torch.randint(0, 12, (3, 5), generator=g), torch.randint(0, 12, (3, 4), generator=g)
    logits = torch.randn(3, 5, 12, generator=g)
    ours = penalize(logits, seen_tokens(context, draft, 12), 1.7)
    hf = RepetitionPenaltyLogitsProcessor(1.7)
    for j in range(5):
        prefix = torch.cat([context, draft[:, :j]], 1)
        assert torch.equal(ours[:, j], hf(prefix, logits[:, j].clone()))


def test_repetition_penalty_keeps_every_method_identical_to_plain_decoding(models):
    runs = _runs(models, repetition_penalty=1.4)
    plain = _runs(models)["ar"]
    for method, result in runs.items():
        assert [o.tokens for o in result.outputs] == [o.tokens for o in runs["ar"].outputs], method
    print("spec-ar tau", runs["spec-ar"].metrics.tau)
    assert runs["spec-ar"].metrics.tau > 2  # accepted drafts sat in the penalised context
    assert [o.tokens for o in plain.outputs] != [o.tokens for o in runs["ar"].outputs]  # it does act


def test_repetition_penalty_equals_transformers_generate(tiny, models):
    model = AutoModelForCausalLM.from_pretrained(str(tiny.gpt2)).eval()
    ours = generate(PROMPTS, target=models["target"], method="ar", repetition_penalty=1.4, max_new_tokens=16)
    V = models["target"].vocab_size
    for prompt, out in zip(PROMPTS, ours.outputs):
        ids = torch.tensor([models["target"].tokenizer.encode(prompt)])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                            repetition_penalty=1.4, suppress_tokens=list(range(V, model.config.vocab_size)),
                            eos_token_id=models["target"].eos_token_id, pad_token_id=0)
        assert hf[0, ids.shape[1]:].tolist() == out.tokens


def test_stop_strings_cut_every_method_where_plain_decoding_stops(models):
    free = _runs(models)["ar"]
    # a stop string taken from the middle of each free continuation's text
    stops = sorted({o.text[8:11] for o in free.outputs if len(o.text) > 12 and o.text[8:11].strip()})
    runs = _runs(models, stop=stops)
    for got in zip(*(r.outputs for r in runs.values())):
        assert len({tuple(o.tokens) for o in got}) == 1 and len({o.text for o in got}) == 1
    for want, out in zip(free.outputs, runs["ar"].outputs):
        assert out.metrics.stop_reason == "stop" or not any(s in want.text for s in stops)
        assert want.tokens[:len(out.tokens)] == out.tokens and not any(s in out.text for s in stops)
        if out.metrics.stop_reason == "stop":
            cut = min(i for i in (want.text.find(s) for s in stops) if i >= 0)
            assert out.text == want.text[:cut]
    assert sum(o.metrics.stop_reason == "stop" for o in runs["spec-ar"].outputs) >= 2
    assert runs["spec-ar"].metrics.tau > 2  # stops fell inside steps that accepted several tokens


def test_cli_stop_streams_the_same_text(tiny):
    args = ["generate", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "24",
            "--stop", "the", "--stop", "\n"] + [a for p in PROMPTS for a in ("--prompt", p)]
    plain, streamed = CliRunner().invoke(cli, args), CliRunner().invoke(cli, args + ["--stream"])
    assert plain.exit_code == streamed.exit_code == 0, plain.output
    assert plain.stdout == streamed.stdout and "the" not in plain.stdout


@pytest.fixture(scope="module")
def chat_target(tiny, tmp_path_factory):
    return load_target(str(with_chat(tiny.gpt2, tmp_path_factory.mktemp("chat") / "gpt2-chat")))


def test_chat_prompts_go_through_the_template(chat_target, models):
    p = plan(target=chat_target, method="ar", chat=True, system="Be brief.")
    ids = encode_prompts(chat_target, ["Hi"], 8, text=p.text)[0]
    assert chat_target.tokenizer.decode(ids) == "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    ar = generate(PROMPTS, target=chat_target, method="ar", chat=True, max_new_tokens=12)
    spec = generate(PROMPTS, target=chat_target, drafter=models["drafter"], chat=True, max_new_tokens=12)
    assert [o.tokens for o in ar.outputs] == [o.tokens for o in spec.outputs]
    assert ar.texts != generate(PROMPTS, target=chat_target, method="ar", max_new_tokens=12).texts


def test_a_pairs_chat_default_applies_and_an_option_beats_it(chat_target, tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(f"""models:
  - name: chat-target
    kind: target
    path: {chat_target.model.name_or_path}
  - name: chat-pair
    kind: pair
    target: chat-target
    drafter: chat-target
    defaults: {{method: ar, chat: true}}
""")
    from specdiff.registry import load_registry

    reg = load_registry(registry)
    assert plan(pair="chat-pair", target=chat_target, registry=reg).text.chat
    assert not plan(pair="chat-pair", target=chat_target, registry=reg, chat=False).text.chat
    bad = tmp_path / "bad.yaml"
    bad.write_text(registry.read_text().replace("chat: true", "chat: 1"))
    with pytest.raises(UsageError, match="default 'chat' has the wrong type"):
        load_registry(bad)


@pytest.mark.parametrize("options,message", [
    ({"chat": True}, "has no chat template"),
    ({"system": "x"}, "needs `chat`"),
    ({"stop": [""]}, "`stop` strings must be non-empty"),
    ({"repetition_penalty": 0}, "`repetition_penalty` must be a finite number from 1e-30 to 1e"),
])
def test_bad_text_options_are_refused(models, options, message):
    with pytest.raises(UsageError, match=message):
        plan(target=models["target"], method="ar", **options)


def test_cli_chat_without_template_is_one_line(tiny):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--prompt", "x", "--chat"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "drop --chat" in result.stderr
