"""Per-token logprobs: each generated token's log-probability under the distribution it was emitted from, checked
against full forwards of the tiny fp32 models (no cache): the target's processed p under a lossless rule (with
bias and penalties, chains and trees), the rule's exact induced law at a drafted position under a lossy rule, and
p at temperature 1 for greedy decoding."""

from __future__ import annotations

import math

import pytest
import torch

from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import History, SamplingConfig, process
from verispec.drafters import ModelDrafter
from verispec.drafters.tree import TreeDrafter
from verispec.runtime.engine import Engine
from verispec.testing import tiny_qwen

V = 16  # small enough that logprobs=V lists the whole distribution (MAX_TOP_LOGPROBS is 20)


@pytest.fixture(scope="module")
def models():
    return tiny_qwen(21, vocab_size=V, logit_scale=4), tiny_qwen(22, vocab_size=V, logit_scale=4)


def _dist(model, prompt: list[int], tokens: list[int], cfg: SamplingConfig) -> torch.Tensor:
    """The model's processed next-token distribution after ``prompt + tokens`` by a full forward."""
    seq = prompt + tokens
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, -1]
    hist = History.of(prompt, tokens, V) if cfg.uses_history else None
    return process(logits, cfg, hist)


def _check_target_law(out, target, prompt, cfg, k):
    assert len(out.logprobs) == len(out.token_ids) > 0
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        p = _dist(target, prompt, out.token_ids[:i], cfg)
        assert lp.token == tok and lp.logprob == pytest.approx(math.log(float(p[tok])), abs=1e-4)
        assert [t for t, _ in lp.top] == p.topk(k).indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(p.topk(k).values.log().tolist(), abs=1e-4)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_lossless_logprobs_are_the_target_law(models, kind):
    """Lossless, T = 0.9 with a logit bias and a repetition penalty: every token's logprob and its top-3 are those
    of the processed target p after the tokens before it, whether it was an accepted draft, a correction or a
    bonus token, over 4 seeds."""
    target, draft = models
    drafter = ModelDrafter(HFBackend(draft)) if kind == "chain" else TreeDrafter(HFBackend(draft), depth=3, top_k=2)
    eng = Engine(HFBackend(target), drafter)
    cfg = SamplingConfig(temperature=0.9, logit_bias={3: 1.5}, repetition_penalty=1.3)
    prompt = [1, 5, 2, 7]
    accepted = 0
    for seed in range(4):
        out = eng.generate(prompt, sampling=cfg, gamma=3, max_new_tokens=12, seed=seed, logprobs=3)
        _check_target_law(out, target, prompt, cfg, 3)
        accepted += out.metrics.accepted
    assert accepted > 0  # accepted drafts were checked too, not only corrections


def test_greedy_logprobs_are_the_target_at_temperature_one(models):
    """At temperature 0 the emitted law is a point mass; the logprobs reported are the target's at temperature 1
    with the same bias."""
    target, draft = models
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    greedy = SamplingConfig(temperature=0, logit_bias={4: 2.0})
    prompt = [3, 3, 8]
    out = eng.generate(prompt, sampling=greedy, gamma=4, max_new_tokens=10, logprobs=2)
    _check_target_law(out, target, prompt, greedy.untempered(), 2)
    assert all(lp.top[0][0] == tok for tok, lp in zip(out.token_ids, out.logprobs, strict=True))  # argmax


def test_lossy_logprobs_are_the_induced_law_at_a_drafted_position(models):
    """Lenience (l = 0.3), T = 1: the first token of a request is always drafted (gamma 3), so its reported
    distribution, all V tokens listed, is the rule's exact induced law pi = q h + (sum q (1 - h)) r at the prompt,
    computed from full forwards; with logprobs_mode 'target' it is p. The two differ (TV > 0.02)."""
    target, draft = models
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    rule, cfg, prompt = get("lenience", l=0.3), SamplingConfig(temperature=1.0), [2, 9, 4]
    p = _dist(target, prompt, [], cfg)
    q = rule.draft(_dist(draft, prompt, [], cfg))
    induced = rule.induced(p, q)
    assert 0.5 * float((induced - p).abs().sum()) > 0.02
    for mode, law in (("emitted", induced), ("target", p)):
        out = eng.generate(prompt, rule=rule, sampling=cfg, gamma=3, max_new_tokens=4, seed=1, logprobs=V,
                           logprobs_mode=mode)
        got = torch.zeros(V, dtype=torch.float64)
        for tok, lp in out.logprobs[0].top:
            got[tok] = math.exp(lp)
        assert torch.allclose(got, law, atol=1e-5), mode
        assert out.logprobs[0].logprob == pytest.approx(math.log(float(law[out.token_ids[0]])), abs=1e-5)


def test_logprobs_bad_values_are_named(models):
    target, draft = models
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    with pytest.raises(ValueError, match="logprobs must be less than or equal to 20, got 21"):
        eng.generate([1, 2], logprobs=21, max_new_tokens=2)
    with pytest.raises(ValueError, match="unknown logprobs_mode 'raw'; available: emitted, target"):
        eng.generate([1, 2], logprobs=1, logprobs_mode="raw", max_new_tokens=2)
    tree = Engine(HFBackend(target), TreeDrafter(HFBackend(draft), depth=2))
    with pytest.raises(ValueError, match="logprobs_mode 'target'"):
        tree.generate([1, 2], rule=get("typical"), sampling=SamplingConfig(temperature=1.0), logprobs=1,
                      max_new_tokens=2)
    out = eng.generate([1, 2], max_new_tokens=3)
    assert out.logprobs is None and "logprobs" not in out.to_dict()


@pytest.mark.parametrize("chunk", [3, 256])
def test_prompt_logprobs_are_the_targets_own_log_softmax(models, chunk):
    """Each prompt token's logprob given the ones before (the first: None) equals the log-softmax of one full
    forward's logits at the position before it, whether the prompt is scored in one forward or in chunks of 3;
    a request's ``prompt_logprobs`` carries the same, and its generation is unchanged by asking."""
    target, draft = models
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    prompt = [1, 5, 2, 7, 7, 3, 0, 11, 4, 9]
    with torch.no_grad():
        want = torch.log_softmax(target(torch.tensor([prompt])).logits[0].double(), -1)
    got = eng.prompt_logprobs(prompt, top=2, chunk=chunk)
    assert got[0].token == 1 and got[0].logprob is None
    for j in range(1, len(prompt)):
        assert got[j].token == prompt[j]
        assert got[j].logprob == pytest.approx(float(want[j - 1, prompt[j]]), abs=1e-5)
        assert [t for t, _ in got[j].top] == want[j - 1].topk(2).indices.tolist()
    out = eng.generate(prompt, sampling=SamplingConfig(temperature=0), gamma=3, max_new_tokens=6, prompt_logprobs=0)
    plain = eng.generate(prompt, sampling=SamplingConfig(temperature=0), gamma=3, max_new_tokens=6)
    assert [e.logprob for e in out.prompt_logprobs] == pytest.approx([e.logprob for e in got], abs=1e-6)
    assert out.token_ids == plain.token_ids and plain.prompt_logprobs is None
