"""The decoding loop on tiny random Qwen2 models (fp32, built from a config): greedy equality, exact
sampling distributions, cache exactness, stop conditions."""

from __future__ import annotations

import pytest
import torch

from verispec.analysis import sequence_distribution
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig, history_counts, process
from verispec.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from verispec.runtime.engine import Engine, SpeculativeEngine
from verispec.runtime.types import Request
from verispec.testing import chi_square_pvalue, reference_greedy, tiny_qwen

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair():
    return tiny_qwen(1, vocab_size=64), tiny_qwen(2, vocab_size=64)


def test_greedy_equals_target_greedy(pair):
    target, draft = pair
    engines = {
        "model": SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft))),
        "self": SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(target))),
        "ngram": SpeculativeEngine(HFBackend(target), NgramDrafter()),
        "hybrid": SpeculativeEngine(HFBackend(target), HybridDrafter(ModelDrafter(HFBackend(draft)), min_ngram=1)),
        "none": SpeculativeEngine(HFBackend(target), None),
    }
    gen = torch.Generator().manual_seed(0)
    for trial in range(8):
        # repetitive prompts give the n-gram drafter real matches
        base = torch.randint(0, 64, (4,), generator=gen).tolist()
        prompt = base * 3 if trial % 2 else torch.randint(0, 64, (9,), generator=gen).tolist()
        ref = reference_greedy(target, prompt, 24)
        for name, eng in engines.items():
            for gamma in (1, 2, 4, 7):
                out = eng.generate(prompt, sampling=GREEDY, gamma=gamma, max_new_tokens=24)
                assert out.token_ids == ref, (name, trial, gamma)
                assert out.metrics.new_tokens == 24 and out.finish_reason == "length"


def test_self_draft_accepts_everything(pair):
    """Guards against vacuous passes: with draft = target, greedy drafting must accept every drafted token."""
    target, _ = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(target)))
    out = eng.generate([1, 2, 3, 4], sampling=GREEDY, gamma=4, max_new_tokens=26)
    m = out.metrics
    assert m.drafted > 0 and m.accepted == m.drafted
    # 5 full rounds of 4 accepted + bonus (25 tokens), then one round capped to gamma 0 for the last token
    assert (m.rounds, m.accepted, m.drafted) == (6, 20, 20)
    assert m.block_efficiency == pytest.approx(20 / 6)


def test_ngram_drafter_accepts_on_repeats(pair):
    target, _ = pair
    prompt = reference_greedy(target, [5, 6, 7], 30)
    prompt = [5, 6, 7] + prompt
    eng = SpeculativeEngine(HFBackend(target), NgramDrafter())
    # continuing a greedy trajectory that already cycles: lookups must hit and be accepted at least once
    out = eng.generate(prompt, sampling=GREEDY, gamma=4, max_new_tokens=20)
    assert out.token_ids == reference_greedy(target, prompt, 20)
    assert out.metrics.drafted > 0


# -- exact sequence distributions ------------------------------------------------------------------------
V_SMALL = 5
N_SEQ = 4000  # continuations sampled per configuration
BATCH = 64  # rows decoded at once while sampling them
ALPHA = 1e-4


def _dist_fns(target, draft, cfg):
    def make(model):
        cache: dict[tuple[int, ...], torch.Tensor] = {}

        def fn(prefix):
            if prefix not in cache:
                with torch.no_grad():
                    logits = model(torch.tensor([list(prefix)])).logits[0, -1]
                counts = history_counts(torch.zeros(V_SMALL, dtype=torch.long), torch.tensor(prefix))[-1]
                cache[prefix] = process(logits, cfg, counts)
            return cache[prefix]

        return fn

    return make(target), make(draft)


def _chi2_sequences(eng, rule, cfg, exact, prompt, gamma, length, verifier="token"):
    counts: dict[tuple[int, ...], int] = {}
    # one seeded row per continuation, decoded BATCH rows at a time (a row's tokens do not depend on its batch)
    outs = eng.generate([list(prompt)] * N_SEQ, rule=rule, sampling=cfg, gamma=gamma, max_new_tokens=length,
                        seed=list(range(N_SEQ)), verifier=verifier, batch_size=BATCH)
    for out in outs:
        key = tuple(out.token_ids)
        assert exact.get(key, 0.0) > 0, f"sampled a zero-probability continuation {key}"
        counts[key] = counts.get(key, 0) + 1
    return chi_square_pvalue(counts, exact)  # bins with expected count < 5 pooled into one


@pytest.mark.parametrize(
    "rule, cfg, gamma, length",
    [
        ("lossless", SamplingConfig(temperature=1.0), 2, 3),
        ("lossless", SamplingConfig(temperature=0.8, top_p=0.8), 2, 3),
        ("lossless", SamplingConfig(temperature=1.0, repetition_penalty=1.8), 3, 3),
        (get("lenience", l=0.3), SamplingConfig(temperature=1.0), 2, 3),
        (get("spec-cascade", p_base=0.2), SamplingConfig(temperature=1.0), 2, 2),
    ],
)
def test_sampled_continuations_match_exact_distribution(rule, cfg, gamma, length):
    """Chi-square goodness of fit, N = 4000 continuations, alpha = 1e-4, bins with expected < 5 pooled.

    The exact law is the target's own sequence distribution for lossless (checked too), and the rule's exact
    composition over positions (``sequence_distribution``) for a lossy rule."""
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    rule = get(rule) if isinstance(rule, str) else rule
    p_fn, q_fn = _dist_fns(target, draft, cfg)
    prompt = (1, 3, 2)
    exact = sequence_distribution(rule, p_fn, q_fn, gamma, length, prompt)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    if rule.lossless:
        plain = sequence_distribution(rule, p_fn, None, gamma, length, prompt)
        assert max(abs(exact.get(k, 0) - v) for k, v in plain.items()) < 1e-12
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    pvalue = _chi2_sequences(eng, rule, cfg, exact, list(prompt), gamma, length)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize(("cfg", "verifier"), [(SamplingConfig(temperature=1.0), "block"),
                                               (SamplingConfig(temperature=0.8, top_k=5), "block"),
                                               (SamplingConfig(temperature=0.9, top_p=0.9), "hsd")])
def test_block_verified_continuations_match_the_target_law(cfg, verifier):
    """Block and HSD verification through the engine (gamma 3, processors on p and q): chi-square of N = 4000
    continuations against the target's own law, alpha = 1e-4, hard failure on a zero-probability continuation;
    the enumerated law of the verifier equals the target's to 1e-12 first."""
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    p_fn, q_fn = _dist_fns(target, draft, cfg)
    prompt = (1, 3, 2)
    plain = sequence_distribution("lossless", p_fn, None, 0, 3, prompt)
    law = sequence_distribution("lossless", p_fn, q_fn, 3, 3, prompt, verifier=verifier)
    assert max(abs(law.get(k, 0) - v) for k, v in plain.items()) < 1e-12
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    pvalue = _chi2_sequences(eng, get("lossless"), cfg, plain, list(prompt), 3, 3, verifier=verifier)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


def test_hybrid_drafter_sampled_law_is_the_target_law():
    """Rounds alternate between token-only (n-gram) and full-q (model) drafts; lossless must still give the
    target's sequence law. Chi-square, N = 4000 continuations, alpha = 1e-4, hard failure on zero probability."""
    cfg = SamplingConfig(temperature=1.0)
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    p_fn, _ = _dist_fns(target, draft, cfg)
    prompt = (1, 3, 2, 1, 3)  # the suffix "1 3" occurred before: the first round is an n-gram round
    exact = sequence_distribution("lossless", p_fn, None, 0, 3, prompt)
    drafter = HybridDrafter(ModelDrafter(HFBackend(draft)), min_ngram=1)
    eng = SpeculativeEngine(HFBackend(target), drafter)
    pvalue = _chi2_sequences(eng, get("lossless"), cfg, exact, list(prompt), 2, 3)
    assert drafter.lookups > 0
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


def test_logit_bias_sampled_law_is_the_biased_target_law():
    """logit_bias is applied to p and q alike, so lossless speculative sampling draws the biased target's
    sequence law. Chi-square, N = 4000 continuations, alpha = 1e-4, hard failure on a zero-probability
    continuation; a -100 bias leaves token 4 about 1e-44 of the mass, so a single sampled 4 lands in a bin with
    expected count ~0 and fails the test. The biased law is checked to differ from the unbiased one."""
    cfg = SamplingConfig(temperature=1.0, logit_bias={1: 1.5, 4: -100.0})
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    p_fn, _ = _dist_fns(target, draft, cfg)
    prompt = (1, 3, 2)
    exact = sequence_distribution("lossless", p_fn, None, 0, 3, prompt)
    plain_p, _ = _dist_fns(target, draft, SamplingConfig(temperature=1.0))
    plain = sequence_distribution("lossless", plain_p, None, 0, 3, prompt)
    assert 0.5 * sum(abs(exact.get(k, 0) - plain.get(k, 0)) for k in set(exact) | set(plain)) > 0.1
    assert sum(v for k, v in exact.items() if 4 in k) < 1e-40
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    pvalue = _chi2_sequences(eng, get("lossless"), cfg, exact, list(prompt), 3, 3)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


def test_logit_bias_greedy_equals_biased_target_greedy(pair):
    """Greedy with a bias: draft and target argmax over the same biased logits, so the output is the biased
    target's own greedy continuation (float32, exact); +100 on one token forces it everywhere."""
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    bias = {5: 3.0, 9: 2.0, 17: -100.0}
    greedy = SamplingConfig(temperature=0, logit_bias=bias)
    prompt = [3, 1, 4, 1, 5]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(16):
            logits = target(torch.tensor([seq])).logits[0, -1]
            logits[list(bias)] += torch.tensor(list(bias.values()))
            seq.append(int(logits.argmax()))
    out = eng.generate(prompt, sampling=greedy, gamma=4, max_new_tokens=16)
    assert out.token_ids == seq[len(prompt):] != reference_greedy(target, prompt, 16)
    forced = eng.generate(prompt, sampling=SamplingConfig(temperature=0, logit_bias={7: 100.0}), gamma=4,
                          max_new_tokens=8)
    assert forced.token_ids == [7] * 8
    with pytest.raises(ValueError, match="logit_bias: token 64 is outside the vocabulary"):
        eng.generate(prompt, sampling=SamplingConfig(logit_bias={64: 1.0}), max_new_tokens=2)


def test_lossy_composition_differs_from_target():
    """The lossy law the previous test checks is really different from the target's (not a vacuous pass)."""
    cfg = SamplingConfig(temperature=1.0)
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    p_fn, q_fn = _dist_fns(target, draft, cfg)
    lossy = sequence_distribution(get("lenience", l=0.3), p_fn, q_fn, 2, 3, (1, 3, 2))
    plain = sequence_distribution("lossless", p_fn, None, 2, 3, (1, 3, 2))
    tv = 0.5 * sum(abs(lossy.get(k, 0) - plain.get(k, 0)) for k in set(lossy) | set(plain))
    assert tv > 0.02


# -- cache exactness -------------------------------------------------------------------------------------
def _check_caches(eng, rows):
    """Each row's cached target/draft history KV gives the same next-token logits as a fresh full forward."""
    for row in rows:
        committed = row.ids
        for backend, brow in ((eng.target, row.target_row), (eng.drafter.backend, eng.drafter._brow[row.key])):
            if backend is eng.target:  # the draft still holds its rejected guesses until its next proposal
                cached = backend.cached_tokens(brow)
                assert cached == committed[: len(cached)] and len(cached) >= len(committed) - 2
            got = backend.forward_ids(brow, committed)[0]
            with torch.no_grad():
                fresh = backend.model(torch.tensor([committed])).logits[0, -1]
            assert (got - fresh).abs().max() < 1e-4


def test_cache_after_accepts_and_rejects_matches_fresh_forward(pair):
    """After every round the target's and draft's cached next-token logits equal a fresh full forward over the
    committed history (max abs difference < 1e-4 in fp32), for one row and for rows batched together."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    cfg = SamplingConfig(temperature=1.0)
    rejections = 0
    for batch in (1, 1, 2, 6):
        rows = [eng.start(Request([3, 1, 4, 1, 5][: 5 - i % 4], sampling=cfg, gamma=5, max_new_tokens=17,
                                  seed=10 * batch + i)) for i in range(batch)]
        while not all(r.done for r in rows):
            eng.step(rows)
            _check_caches(eng, [r for r in rows if not r.done])
        rejections += sum(r.metrics.drafted - r.metrics.accepted for r in rows)
        for r in rows:
            eng.release(r)
    assert rejections > 0  # the rollback path was exercised


# -- stops -----------------------------------------------------------------------------------------------
class _ToyTokenizer:
    """Decodes token i as the letter chr(97 + i % 26)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_eos_inside_accepted_block_ends_output(pair):
    target, _ = pair
    ref = reference_greedy(target, [1, 2, 3], 20)
    eos = ref[7]
    first = ref.index(eos)
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(target)), eos_token_ids=[eos, 999])
    out = eng.generate([1, 2, 3], sampling=GREEDY, gamma=6, max_new_tokens=20)
    assert out.token_ids == ref[: first + 1]
    assert out.finish_reason == "stop"
    # BE counts only accepted drafts that were emitted: with draft = target all 6 drafts of the round are
    # accepted, but the EOS is itself the 3rd of them and the drafts after it are cut
    m = out.metrics
    assert first == 2 and (m.rounds, m.accepted, m.drafted) == (1, 6, 6)
    assert m.emitted_accepted == len(out.token_ids) == 3 < m.accepted
    assert m.block_efficiency == pytest.approx(3.0)
    from verispec.drafters import TreeDrafter

    tree = SpeculativeEngine(HFBackend(target), TreeDrafter(HFBackend(target), depth=6, top_k=2),
                             eos_token_ids=[eos, 999])
    tm = tree.generate([1, 2, 3], sampling=GREEDY, gamma=6, max_new_tokens=20).metrics
    assert (tm.accepted, tm.emitted_accepted, tm.rounds) == (6, 3, 1) and tm.block_efficiency == pytest.approx(3.0)


def test_stop_string_inside_block(pair):
    target, _ = pair
    tok = _ToyTokenizer()
    ref = reference_greedy(target, [1, 2, 3], 20)
    text = tok.decode(ref)
    stop = text[5:7]
    cut = text.find(stop)
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(target)), tokenizer=tok)
    out = eng.generate([1, 2, 3], sampling=GREEDY, gamma=6, max_new_tokens=20, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert out.token_ids == ref[: cut + len(stop)]  # no token past the one completing the stop string


@pytest.mark.parametrize("max_new", [1, 2, 5, 9])
def test_max_new_tokens_never_exceeded(pair, max_new):
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(target)))
    for gamma in (1, 4, 8):
        out = eng.generate([1, 2], sampling=GREEDY, gamma=gamma, max_new_tokens=max_new)
        assert len(out.token_ids) == max_new and out.finish_reason == "length"


def test_context_limit(pair):
    target = tiny_qwen(1, vocab_size=64, max_context=16)
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(tiny_qwen(2, vocab_size=64, max_context=16))))
    with pytest.raises(ValueError, match="context"):
        eng.generate(list(range(16)), sampling=GREEDY)
    out = eng.generate(list(range(10)), sampling=GREEDY, gamma=4, max_new_tokens=50)
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_seed_reproducible(pair):
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    cfg = SamplingConfig(temperature=0.9, top_k=20)
    a = eng.generate([1, 2, 3], sampling=cfg, gamma=3, max_new_tokens=20, seed=42)
    b = eng.generate([1, 2, 3], sampling=cfg, gamma=3, max_new_tokens=20, seed=42)
    c = eng.generate([1, 2, 3], sampling=cfg, gamma=3, max_new_tokens=20, seed=43)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_bad_inputs(pair):
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.generate([1, 64], sampling=GREEDY)
    with pytest.raises(ValueError, match="empty"):
        eng.generate([], sampling=GREEDY)
    with pytest.raises(ValueError, match="gamma"):
        eng.generate([1], gamma=-1)


def test_metrics_consistent(pair):
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    out = eng.generate([1, 2, 3], sampling=SamplingConfig(temperature=1.0), gamma=3, max_new_tokens=30, seed=1)
    m = out.metrics
    assert m.new_tokens == len(out.token_ids) == 30
    assert sum(a for _, a in m.per_round) == m.accepted
    assert m.rounds == len(m.per_round)
    assert m.accepted_per_position[0] == sum(1 for d, a in m.per_round if d and a >= 1)
    assert m.block_efficiency == pytest.approx(m.emitted_accepted / m.rounds)
    assert m.emitted_accepted <= m.accepted
    assert all(0 <= a <= 1 for a in m.acceptance_per_position)


def test_greedy_lossy_rule_is_deterministic_reference_argmax(pair):
    """Temperature 0 with CoS-WE (lam = 0.5), default greedy_lossy="reference": each round accepts drafts while
    the draft's argmax equals argmax(lam p + (1 - lam) q) of the untempered distributions, emits that argmax at
    the first mismatch and argmax p as the bonus. Checked against a simulation with plain forwards; the output
    does not depend on the seed. greedy_lossy="onehot" (the rule's law on one-hot p and q) does."""
    target, draft = pair
    lam, gamma, n_new = 0.5, 3, 20
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    rule = get("cos-we", lam=lam)
    prompt = [4, 8, 15, 16, 23]

    def dist(model, seq):
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([seq])).logits[0, -1].double(), -1)

    seq, out = list(prompt), []
    while len(out) < n_new:
        g = min(gamma, n_new - len(out) - 1)
        emitted, ctx = [], list(seq)
        for _ in range(g):
            q, p = dist(draft, ctx), dist(target, ctx)
            x, best = int(q.argmax()), int((lam * p + (1 - lam) * q).argmax())
            emitted.append(best)
            ctx.append(best)
            if x != best:
                break
        else:
            emitted.append(int(dist(target, ctx).argmax()))
        seq += emitted
        out += emitted
    runs = [eng.generate(prompt, rule=rule, sampling=GREEDY, gamma=gamma, max_new_tokens=n_new, seed=s).token_ids
            for s in (0, 1)]
    assert runs[0] == runs[1] == out[:n_new]
    assert out[:n_new] != reference_greedy(target, prompt, n_new)  # the rule really mixes in the draft
    onehot = {tuple(eng.generate(prompt, rule=rule, sampling=GREEDY, gamma=gamma, max_new_tokens=n_new, seed=s,
                                 greedy_lossy="onehot").token_ids) for s in range(4)}
    assert len(onehot) > 1
