"""The block sampler against the exact analysis.

Statistical setup (every sampled test below):

* sample size N is stated per test (N draws are the N rows of ONE batched ``verify_block`` call);
* test: Pearson chi-square goodness of fit of the emitted-token counts against the exact distribution from
  :func:`verispec.analysis.induced_distribution` (or ``rule.bonus``), bins with expected count < 5 pooled into
  one bin (merged into the smallest bin if the pool is still < 5); with a single bin left the counts must equal N;
* threshold: reject when the p-value is below alpha = 1e-4;
* hard failure, independent of any statistic, if an emitted token has exact probability 0;
* acceptance counts: two-sided binomial z-test, |z| < 3.891 (alpha = 1e-4); exact equality when the
  probability is 0 or 1;
* fixed seeds (torch.Generator), so every run draws the same numbers.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from verispec import rules
from verispec.analysis import acceptance_probability, induced_distribution
from verispec.core.rules.lossless import Lossless
from verispec.core.verify.chain import sample_categorical, verify_block, verify_greedy
from verispec.testing import RULE_CONFIGS

ALPHA = 1e-4
Z_CRIT = 3.891  # two-sided normal quantile for alpha = 1e-4

CONFIG_IDS = [f"{n}{'-' + '-'.join(f'{k}={v}' for k, v in p.items()) if p else ''}" for n, p in RULE_CONFIGS]


def test_every_registered_rule_is_covered():
    assert {name for name, _ in RULE_CONFIGS} == set(rules.names())


# ----------------------------------------------------------------------------------------------- helpers


def d(x: object) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def chi2_pvalue(tokens: torch.Tensor, expected: torch.Tensor, label: str = "") -> float:
    """Pearson chi-square p-value of ``tokens`` against ``expected`` (pooling bins with expected count < 5).

    Fails hard (AssertionError) when a token has exact probability 0 or lies outside the vocabulary.
    """
    expected = d(expected)
    n, v = int(tokens.numel()), int(expected.shape[-1])
    assert n > 0, f"{label}: no draws"
    assert int(tokens.min()) >= 0 and int(tokens.max()) < v, f"{label}: token outside the vocabulary"
    zero = expected[tokens] == 0
    assert not bool(zero.any()), f"{label}: emitted token(s) {tokens[zero].unique().tolist()} have probability 0"
    observed = torch.bincount(tokens, minlength=v).to(torch.float64)
    exp_counts = expected / expected.sum() * n
    big = exp_counts >= 5
    obs_b, exp_b = observed[big].tolist(), exp_counts[big].tolist()
    small_exp, small_obs = float(exp_counts[~big].sum()), float(observed[~big].sum())
    if small_exp > 0:
        if small_exp >= 5 or not exp_b:
            obs_b.append(small_obs)
            exp_b.append(small_exp)
        else:
            i = min(range(len(exp_b)), key=exp_b.__getitem__)
            obs_b[i] += small_obs
            exp_b[i] += small_exp
    if len(exp_b) == 1:
        return 1.0 if obs_b[0] == n else 0.0
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_b, exp_b, strict=True))
    return float(stats.chi2.sf(stat, len(exp_b) - 1))


def assert_fits(tokens: torch.Tensor, expected: torch.Tensor, label: str = "") -> None:
    pv = chi2_pvalue(tokens, expected, label)
    assert pv >= ALPHA, f"{label}: chi-square p-value {pv:.3g} < {ALPHA} (N={tokens.numel()})"


def assert_binomial(successes: int, n: int, prob: float, label: str = "") -> None:
    if prob <= 0 or prob >= 1:
        assert successes == round(prob * n), f"{label}: {successes}/{n} with exact probability {prob}"
        return
    z = (successes - n * prob) / math.sqrt(n * prob * (1 - prob))
    assert abs(z) < Z_CRIT, f"{label}: z = {z:.2f} ({successes}/{n} vs {prob:.6f})"


def draw(q: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """Draft tokens drawn by the test itself (torch.multinomial, not the code under test)."""
    return torch.multinomial(q.to(torch.float64), n, replacement=True, generator=g)


def run_gamma1(rule, p, q, n, seed, token_only=False):
    """Draw n draft tokens from q and verify them (gamma = 1, p at the drafted and the bonus position) in ONE
    batched call of n rows. Returns (emitted token at position 1, accepted flag)."""
    g = torch.Generator().manual_seed(seed)
    v = p.shape[-1]
    drafts = draw(q, n, g).unsqueeze(-1)
    qq = None if token_only else q.expand(n, 1, v)
    res = verify_block(rule, drafts, qq, p.expand(n, 2, v), generator=g)
    return res.tokens[:, 0], res.num_accepted == 1


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def make_pairs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2024)
    pairs = {
        "generic": (_softmax(torch.randn(8, generator=g, dtype=torch.float64)),
                    _softmax(torch.randn(8, generator=g, dtype=torch.float64))),
        "zeros_in_p": (d([0.0, 0.45, 0.0, 0.3, 0.2, 0.05, 0.0]), d([0.2, 0.1, 0.15, 0.25, 0.05, 0.05, 0.2])),
        "zeros_in_q": (d([0.1, 0.4, 0.05, 0.25, 0.2]), d([0.0, 0.6, 0.0, 0.4, 0.0])),
        "equal": (d([0.5, 0.2, 0.15, 0.1, 0.05]), d([0.5, 0.2, 0.15, 0.1, 0.05])),
        "near_ties": (d([0.2501, 0.25, 0.2499, 0.25]), d([0.25, 0.2501, 0.25, 0.2499])),
    }
    # large vocabulary: 20 boosted tokens carry most of p; q is a noisy copy
    v = 5000
    base = 1.5 * torch.randn(v, generator=g, dtype=torch.float64)
    top = torch.randperm(v, generator=g)[:20]
    base[top] += 6.0
    p = _softmax(base)
    q = _softmax(base + 0.8 * torch.randn(v, generator=g, dtype=torch.float64))
    pairs["large_v5000"] = (p, q)
    return pairs


PAIRS = make_pairs()
N_SMALL = 20_000
N_LARGE = 1_500


# ----------------------------------------------------------------------------------------------- gamma = 1


@pytest.mark.parametrize(("name", "params"), RULE_CONFIGS, ids=CONFIG_IDS)
def test_gamma1_emitted_token_matches_induced(name, params):
    """For each (p, q) pair: N = 20,000 draws (1,500 for V = 5000, to bound time and memory); chi-square of the
    emitted token vs induced_distribution at alpha = 1e-4; binomial z-test of the acceptance count vs
    acceptance_probability at alpha = 1e-4; any emitted token of exact probability 0 fails."""
    rule = rules.get(name, **params)
    for i, (label, (p, q)) in enumerate(PAIRS.items()):
        large = p.shape[-1] > 100
        n = N_LARGE if large else N_SMALL
        tokens, accepted = run_gamma1(rule, p, q, n, seed=1000 + i)
        assert_fits(tokens, induced_distribution(rule, p, q), f"{rule.describe()} on {label}")
        assert_binomial(int(accepted.sum()), n, float(acceptance_probability(rule, p, q)), f"{label} acceptance")


# ----------------------------------------------------------------------------------------------- gamma = 3

BLOCK_P = d([
    [0.40, 0.25, 0.15, 0.10, 0.07, 0.03],
    [0.05, 0.50, 0.20, 0.15, 0.10, 0.00],
    [0.30, 0.00, 0.35, 0.20, 0.10, 0.05],
    [0.10, 0.10, 0.10, 0.50, 0.15, 0.05],  # bonus position
])
BLOCK_Q = d([
    [0.45, 0.20, 0.10, 0.15, 0.05, 0.05],
    [0.10, 0.55, 0.10, 0.10, 0.05, 0.10],
    [0.25, 0.05, 0.45, 0.10, 0.15, 0.00],
])
N_BLOCK = 40_000


@pytest.mark.parametrize(("name", "params"), RULE_CONFIGS, ids=CONFIG_IDS)
def test_block_positions_conditioned_on_reaching_them(name, params):
    """gamma = 3, distinct (p_k, q_k) per position, drafts drawn from q_k by the test; N = 40,000 blocks.

    Position k's emitted token, among the rows that reached k (first k-1 drafts accepted), is chi-square tested
    against induced(p_k, q_k); the bonus token (all 3 accepted) against rule.bonus(p_4); alpha = 1e-4. The
    number of rows reaching each position is binomial-tested against the product of exact acceptance
    probabilities (alpha = 1e-4), and each tested subsample must have at least 500 rows.
    """
    rule = rules.get(name, **params)
    g = torch.Generator().manual_seed(77)
    gamma, v = 3, BLOCK_P.shape[-1]
    drafts = torch.stack([draw(BLOCK_Q[k], N_BLOCK, g) for k in range(gamma)], dim=-1)
    res = verify_block(rule, drafts, BLOCK_Q.expand(N_BLOCK, gamma, v), BLOCK_P.expand(N_BLOCK, gamma + 1, v), g)
    reach = 1.0
    for k in range(gamma + 1):
        rows = res.num_accepted >= k
        assert_binomial(int(rows.sum()), N_BLOCK, reach, f"reach position {k + 1}")
        assert int(rows.sum()) >= 500, f"too few rows reach position {k + 1} for a test"
        tokens = res.tokens[rows, k]
        if k < gamma:
            expected = induced_distribution(rule, BLOCK_P[k], BLOCK_Q[k])
            reach *= float(acceptance_probability(rule, BLOCK_P[k], BLOCK_Q[k]))
        else:
            expected = rule.bonus(BLOCK_P[gamma])
        assert_fits(tokens, expected, f"{rule.describe()} position {k + 1}")
    # padding after the emitted prefix
    for k in range(gamma + 1):
        assert bool((res.tokens[res.num_accepted < k, k] == -1).all())
    assert torch.equal(res.bonus, res.num_accepted == gamma)


# ----------------------------------------------------------------------------------------------- token-only drafts


@pytest.mark.parametrize(("name", "params"), RULE_CONFIGS, ids=CONFIG_IDS)
def test_token_only_draft(name, params):
    """q=None (one-hot q on the drafted token), drafts drawn from the generic q by the test: N = 20,000 draws,
    chi-square (alpha = 1e-4) against sum_y q(y) induced(p, onehot_y); for lossless rules that mixture is
    exactly the rule's target (p, or p_Theta)."""
    rule = rules.get(name, **params)
    p, q = PAIRS["generic"]
    onehots = torch.eye(p.shape[-1], dtype=torch.float64)
    mixture = (q.unsqueeze(-1) * induced_distribution(rule, p.expand_as(onehots), onehots)).sum(0)
    if rule.lossless:
        assert torch.allclose(mixture, rule.target(p), atol=1e-12, rtol=0)
    tokens, accepted = run_gamma1(rule, p, q, N_SMALL, seed=5, token_only=True)
    assert_fits(tokens, mixture, f"{rule.describe()} token-only")
    acc = float((q * acceptance_probability(rule, p.expand_as(onehots), onehots)).sum())
    assert_binomial(int(accepted.sum()), N_SMALL, acc, "token-only acceptance")


def test_token_only_lossless_worked_example():
    """Tutorial 3.3: one-hot draft on index 1 of p = [0.6, 0.3, 0.1]: N = 20,000, acceptance 0.3 (binomial
    z-test) and output p (chi-square), alpha = 1e-4."""
    p = d([0.6, 0.3, 0.1])
    g = torch.Generator().manual_seed(9)
    drafts = torch.ones(N_SMALL, 1, dtype=torch.long)
    res = verify_block(Lossless(), drafts, None, p.expand(N_SMALL, 2, 3), g)
    assert_binomial(int((res.num_accepted == 1).sum()), N_SMALL, 0.3, "acceptance")
    assert_fits(res.tokens[:, 0], p, "token-only lossless")
    assert torch.allclose(res.accept_prob, torch.full_like(res.accept_prob, 0.3), atol=1e-15)


# ----------------------------------------------------------------------------------------------- the test can fail


def test_chi_square_rejects_a_wrong_distribution():
    """Power check of the helper at the sizes used: naive-resample draws (N = 20,000) fitted against p are
    rejected; a token of probability 0 fails hard."""
    p, q = d([0.6, 0.3, 0.1]), d([0.2, 0.5, 0.3])
    tokens, _ = run_gamma1(rules.get("naive-resample"), p, q, N_SMALL, seed=3)
    assert chi2_pvalue(tokens, p) < ALPHA
    assert_fits(tokens, d([0.44, 0.42, 0.14]), "naive-resample")
    with pytest.raises(AssertionError, match="probability 0"):
        chi2_pvalue(torch.tensor([0, 1, 2]), d([0.5, 0.5, 0.0]))


# ----------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_output():
    p, q = PAIRS["generic"]
    rule = rules.get("lenience", l=0.5)
    g0 = torch.Generator().manual_seed(0)
    drafts = torch.stack([draw(q, 500, g0) for _ in range(4)], -1)
    pp, qq = p.expand(500, 5, 8), q.expand(500, 4, 8)
    a = verify_block(rule, drafts, qq, pp, torch.Generator().manual_seed(42))
    b = verify_block(rule, drafts, qq, pp, torch.Generator().manual_seed(42))
    c = verify_block(rule, drafts, qq, pp, torch.Generator().manual_seed(43))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    assert torch.equal(a.accept_prob, b.accept_prob)
    assert not torch.equal(a.tokens, c.tokens)
    s1 = sample_categorical(p.expand(100, 8), torch.Generator().manual_seed(1))
    s2 = sample_categorical(p.expand(100, 8), torch.Generator().manual_seed(1))
    assert torch.equal(s1, s2)


# ----------------------------------------------------------------------------------------------- greedy


def test_verify_greedy_hand_examples():
    argmax = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3], [1, 5, 3], [9, 2, 3], [1, 2, 7]])
    res = verify_greedy(drafts, argmax)
    assert res.num_accepted.tolist() == [3, 1, 0, 2]
    assert res.tokens.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [1, -1, -1, -1], [1, 2, 3, -1]]
    assert res.bonus.tolist() == [True, False, False, False]
    assert res.accept_prob.tolist() == [[1, 1, 1], [1, 0, 1], [0, 1, 1], [1, 1, 0]]
    assert [res.emitted(i) for i in range(4)] == [[1, 2, 3, 4], [1, 2], [1], [1, 2, 3]]


def test_verify_greedy_is_target_prefix():
    g = torch.Generator().manual_seed(11)
    argmax = torch.randint(0, 3, (2000, 6), generator=g)
    noise = torch.randint(0, 3, (2000, 5), generator=g)
    drafts = torch.where(torch.rand(2000, 5, generator=g) < 0.7, argmax[:, :5], noise)
    res = verify_greedy(drafts, argmax)
    for i in range(2000):
        n = int(res.num_accepted[i])
        mism = (drafts[i] != argmax[i, :5]).nonzero()
        assert n == (int(mism[0]) if len(mism) else 5)
        assert res.emitted(i) == argmax[i, : n + 1].tolist()


def test_verify_greedy_shape_error_and_gamma0():
    with pytest.raises(ValueError, match="target_argmax"):
        verify_greedy(torch.tensor([[1, 2]]), torch.tensor([[1, 2]]))
    res = verify_greedy(torch.zeros(2, 0, dtype=torch.long), torch.tensor([[5], [6]]))
    assert res.tokens.tolist() == [[5], [6]]


# ----------------------------------------------------------------------------------------------- sample_categorical

ADVERSARIAL = {
    "last_only": [0.0, 0.0, 0.0, 0.0, 1.0],
    "first_only": [1.0, 0.0, 0.0, 0.0, 0.0],
    "interleaved": [0.0, 0.3, 0.0, 0.2, 0.0, 0.5, 0.0],
    "unnormalized": [0.0, 2.0, 0.0, 0.0, 6.0, 0.0],
    "tiny_and_huge": [0.0, 1e-300, 0.0, 1.0, 0.0],
}


@pytest.mark.parametrize("label", list(ADVERSARIAL))
def test_sample_categorical_never_returns_zero_probability(label):
    """N = 50,000 rows in one batched call: no index of probability 0 (hard), chi-square at alpha = 1e-4."""
    probs = d(ADVERSARIAL[label])
    out = sample_categorical(probs.expand(50_000, -1).contiguous(), torch.Generator().manual_seed(8))
    assert out.shape == (50_000,)
    assert_fits(out, probs / probs.sum(), label)


@pytest.mark.parametrize("u_value", [0.0, 1.0 - 2.0**-53, 0.5, 1.0])
@pytest.mark.parametrize("label", list(ADVERSARIAL))
def test_sample_categorical_extreme_uniforms(monkeypatch, label, u_value):
    """The uniform at its extremes (0, the largest float64 below 1, and 1 itself, which torch.rand never returns:
    u = total must be clamped) still lands on an index of positive probability."""
    probs = d(ADVERSARIAL[label])

    def fake_rand(*size, dtype=None, generator=None, device=None):
        return torch.full(size[0] if len(size) == 1 and isinstance(size[0], tuple | torch.Size) else size, u_value,
                          dtype=dtype)

    monkeypatch.setattr(torch, "rand", fake_rand)
    idx = sample_categorical(probs.unsqueeze(0))
    assert float(probs[int(idx[0])]) > 0


def test_sample_categorical_batched_rows_and_no_mass():
    probs = d([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [2.0, 0.0, 0.0]])
    out = sample_categorical(probs.expand(4, 3, 3), torch.Generator().manual_seed(0))
    assert out.tolist() == [[1, 2, 0]] * 4
    with pytest.raises(ValueError, match="no mass"):
        sample_categorical(d([[0.5, 0.5], [0.0, 0.0]]))


# ----------------------------------------------------------------------------------------------- input checks


def test_verify_block_input_errors():
    rule = Lossless()
    p = d([[0.5, 0.5], [0.5, 0.5]]).unsqueeze(0)
    q = d([[0.5, 0.5]]).unsqueeze(0)
    with pytest.raises(ValueError, match="draft_tokens"):
        verify_block(rule, torch.tensor([0]), q, p)
    with pytest.raises(ValueError, match="p must be"):
        verify_block(rule, torch.tensor([[0]]), q, p[:, :1])
    with pytest.raises(ValueError, match="q must be"):
        verify_block(rule, torch.tensor([[0]]), q[..., :1], p)
    with pytest.raises(ValueError, match="NaN"):
        verify_block(rule, torch.tensor([[0]]), q, torch.full_like(p, float("nan")))


def test_gamma0_emits_bonus():
    """gamma = 0 (no draft): N = 20,000 bonus draws from p_Theta of minp-sampling, chi-square alpha = 1e-4."""
    rule = rules.get("minp-sampling", p_base=0.3)
    p = d([0.4, 0.1, 0.3, 0.2])
    res = verify_block(rule, torch.zeros(N_SMALL, 0, dtype=torch.long), None, p.expand(N_SMALL, 1, 4),
                       torch.Generator().manual_seed(4))
    assert bool(res.bonus.all())
    assert_fits(res.tokens[:, 0], rule.bonus(p), "gamma=0")
