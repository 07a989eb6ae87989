"""Block verification (Sun et al. 2024): lossless exactly (enumerated laws), never fewer accepted drafts than
token-wise verification in expectation (exactly), the sampler following its exact round law (chi-square), the
greedy path unchanged, and the engine's refusals."""

from __future__ import annotations

import pytest
import torch

from verispec.analysis.sequence import expected_accepted, round_law, sequence_distribution
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig
from verispec.core.verify.block import verify_chain_block
from verispec.core.verify.chain import verify_greedy
from verispec.testing import chi_square_pvalue, toy_engine, toy_model

CASES = [(seed, vocab, gamma) for seed in range(6) for vocab, gamma in ((2, 3), (3, 2), (4, 3), (5, 2), (5, 3))]


@pytest.mark.parametrize(("seed", "vocab", "gamma"), CASES)
def test_block_verification_is_lossless_exactly(seed, vocab, gamma):
    """Enumerated law of 4-token continuations under block verification = the target's own law, to 1e-12
    (prefix-dependent p and q with exact zeros; vocab <= 5, gamma <= 3)."""
    p_fn, q_fn = toy_model(2 * seed, vocab), toy_model(2 * seed + 1, vocab)
    prompt = (0,)
    target = sequence_distribution("lossless", p_fn, None, 0, 4, prompt)
    block = sequence_distribution("lossless", p_fn, q_fn, gamma, 4, prompt, verifier="block")
    assert sum(block.values()) == pytest.approx(1.0, abs=1e-12)
    assert set(block) <= set(target)  # never a zero-probability continuation
    assert max(abs(block.get(k, 0.0) - v) for k, v in target.items()) < 1e-12


@pytest.mark.parametrize(("seed", "vocab", "gamma"), CASES)
def test_block_accepts_at_least_as_many_as_token_wise(seed, vocab, gamma):
    """Exact expected accepted drafts per round, over several prefixes: block >= token-wise (Theorem 2)."""
    p_fn, q_fn = toy_model(2 * seed, vocab), toy_model(2 * seed + 1, vocab)
    for prefix in [(0,), (1,), (0, 1), (vocab - 1, 0)]:
        block = expected_accepted("lossless", p_fn, q_fn, gamma, prefix, verifier="block")
        token = expected_accepted("lossless", p_fn, q_fn, gamma, prefix)
        assert block >= token - 1e-12, (prefix, block, token)


def test_block_gain_is_real_and_vanishes_at_gamma_one():
    """The inequality is strict somewhere (not a vacuous pass), and with one draft the verifiers coincide."""
    gains = []
    for seed in range(6):
        p_fn, q_fn = toy_model(2 * seed, 4, zeros=False), toy_model(2 * seed + 1, 4, zeros=False)
        gains.append(expected_accepted("lossless", p_fn, q_fn, 3, (0,), verifier="block")
                     - expected_accepted("lossless", p_fn, q_fn, 3, (0,)))
        one_b = round_law("lossless", p_fn, q_fn, 1, (0,), verifier="block")
        one_t = round_law("lossless", p_fn, q_fn, 1, (0,))
        assert max(abs(one_b.get(k, 0.0) - v) for k, v in one_t.items()) < 1e-12
    assert max(gains) > 1e-3


def test_sampler_follows_the_exact_round_law():
    """verify_chain_block on N = 60000 rows (drafts drawn from q per row, seed 0) against the enumerated round law:
    chi-square, alpha = 1e-4, bins with expected < 5 pooled; a sampled zero-probability outcome fails at once."""
    vocab, gamma, n = 4, 3, 60_000
    p_fn, q_fn = toy_model(20, vocab), toy_model(21, vocab)
    exact = round_law("lossless", p_fn, q_fn, gamma, (0,), verifier="block")
    g = torch.Generator().manual_seed(0)
    drafts = torch.empty(n, gamma, dtype=torch.long)
    qs = torch.empty(n, gamma, vocab, dtype=torch.float64)
    ps = torch.empty(n, gamma + 1, vocab, dtype=torch.float64)
    paths: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(n):
        path: tuple[int, ...] = ()
        for _ in range(gamma):
            x = int(torch.multinomial(q_fn((0,) + path), 1, generator=g))
            path += (x,)
        if path not in paths:
            paths[path] = (torch.stack([q_fn((0,) + path[:j]) for j in range(gamma)]),
                           torch.stack([p_fn((0,) + path[:j]) for j in range(gamma + 1)]))
        drafts[i] = torch.tensor(path)
        qs[i], ps[i] = paths[path]
    res = verify_chain_block(drafts, qs, ps, g)
    counts: dict[tuple[int, ...], int] = {}
    for i in range(n):
        key = tuple(res.emitted(i))
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_pvalue(counts, exact) > 1e-4


def test_one_hot_draft_and_greedy_match_token_wise():
    """A token-only draft (q None: one-hot) keeps the law exact, and at temperature 0 (one-hot p) block
    verification accepts exactly the prefix that matches the target's argmax, as the greedy path does."""
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=torch.float64)
    for draft in ([1, 2, 0], [1, 0, 0], [2, 2, 0], [1, 2, 1]):
        y = torch.tensor([draft])
        b = verify_chain_block(y, None, p)
        t = verify_greedy(y, p.argmax(-1))
        assert b.emitted(0) == t.emitted(0)


def test_lossy_rules_and_trees_are_refused():
    with pytest.raises(ValueError, match="verifier 'block' verifies the lossless law"):
        round_law(get("lenience", l=0.5), toy_model(0, 3), toy_model(1, 3), 2, (0,), verifier="block")
    with pytest.raises(ValueError, match="unknown verifier 'blocky'"):
        round_law("lossless", toy_model(0, 3), toy_model(1, 3), 2, (0,), verifier="blocky")
    eng = toy_engine("model")
    with pytest.raises(ValueError, match="verifier 'block' verifies the lossless law"):
        eng.generate([1, 2, 3], rule=get("lenience", l=0.5), verifier="block", max_new_tokens=4)
    tree = toy_engine("tree")
    with pytest.raises(ValueError, match="verifier 'block' verifies a chain"):
        tree.generate([1, 2, 3], verifier="block", max_new_tokens=4)


def test_engine_block_greedy_equals_token_greedy_and_samples_run():
    """Through the engine: greedy output is the same with either verifier; a sampled block-verified run
    accepts drafts and stays reproducible for a seed (constant gamma)."""
    eng = toy_engine("model")
    greedy = SamplingConfig(temperature=0)
    a = eng.generate([1, 2, 3], sampling=greedy, gamma=3, max_new_tokens=24, verifier="block")
    b = eng.generate([1, 2, 3], sampling=greedy, gamma=3, max_new_tokens=24)
    assert a.token_ids == b.token_ids
    cfg = SamplingConfig(temperature=1.0)
    runs = [eng.generate([1, 2, 3], sampling=cfg, gamma=3, max_new_tokens=24, seed=7,
                         verifier="block") for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and runs[0].metrics.accepted > 0


def test_analyze_shows_each_verifiers_expected_accepted_length():
    """`verispec analyze --gamma`: with p = (1/3, 2/3), q = (2/3, 1/3) at every position token-wise verification
    accepts sum(min(p, q)) = 2/3 per position, so 2/3 + 4/9 = 10/9 drafts per round of 2; block accepts more."""
    import json

    from click.testing import CliRunner

    from verispec.cli.main import main

    args = ["analyze", "--rule", "lossless", "--p", "0.3333333333333333,0.6666666666666667",
            "--q", "0.6666666666666667,0.3333333333333333", "--gamma", "2", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["expected_accepted"]
    assert out["token"] == pytest.approx(10 / 9, abs=1e-12) and out["block"] > out["token"] + 1e-3
    lossy = CliRunner().invoke(main, [*args[:2], "lenience", "--param", "l=0.5", *args[3:]])
    assert lossy.exit_code == 0 and set(json.loads(lossy.stdout)["expected_accepted"]) == {"token"}
