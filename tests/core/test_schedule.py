"""Adaptive draft length: the expected-tokens formula, the choice it implies, and losslessness with it."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from verispec.backends.hf import HFBackend
from verispec.core.sampling import SamplingConfig
from verispec.core.schedule import (
    AdaptiveGamma,
    best_gamma,
    break_even_alpha,
    expected_tokens,
    interpolate_costs,
    speedup,
)
from verispec.drafters import ModelDrafter
from verispec.runtime.engine import SpeculativeEngine
from verispec.testing import tiny_qwen


def test_expected_tokens_closed_form():
    for alpha in (0.0, 0.3, 0.9):
        for g in range(6):
            assert expected_tokens(alpha, g) == pytest.approx((1 - alpha ** (g + 1)) / (1 - alpha))


def test_choice_follows_costs_and_acceptance():
    s = AdaptiveGamma(gamma_max=8)
    assert s.choose() == 2  # no measurements yet: a short first draft (a long block may cost several steps)
    for _ in range(50):
        s.update(drafted=5, accepted=0, draft_s=0.5, target_s=0.2)  # useless, expensive draft
    assert s.alpha < 0.01 and s.choose() == 0
    fast = AdaptiveGamma(gamma_max=8)
    for _ in range(50):
        fast.update(drafted=5, accepted=5, draft_s=0.005, target_s=0.2)  # free and always right
    assert fast.best() == 8  # one block length measured: its cost is taken as flat
    assert fast.choose() == 0 and fast.anchors == 1  # ... until one plain round anchors the learned curve
    fast.update(drafted=0, accepted=0, draft_s=0.0, target_s=0.2)  # flat indeed (the GPU picture)
    assert fast.choose() == 8


def test_invalid_arguments():
    with pytest.raises(ValueError):
        AdaptiveGamma(gamma_max=-1)
    eng = SpeculativeEngine(HFBackend(tiny_qwen(1)), None)
    with pytest.raises(ValueError, match="gamma"):
        eng.generate([1, 2], gamma="sometimes")


def test_auto_gamma_keeps_greedy_exact():
    target, draft = tiny_qwen(1), tiny_qwen(2)
    plain = SpeculativeEngine(HFBackend(target), None)
    spec = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    greedy = SamplingConfig(temperature=0)
    for prompt in ([1, 2, 3], [7, 7, 7, 7], [40, 2, 9, 13, 5]):
        ref = plain.generate(prompt, sampling=greedy, gamma=0, max_new_tokens=30).token_ids
        out = spec.generate(prompt, sampling=greedy, gamma="auto", max_new_tokens=30)
        assert out.token_ids == ref
        # the report of what the schedule chose and why: gamma per round, and its beliefs when the row ended
        m = out.metrics
        assert sum(m.gamma_counts.values()) == m.rounds and m.schedule["curve"] == "learned"
        assert m.schedule["block_s"] and 0 <= m.schedule["alpha"] <= 1 and "gamma_counts" in m.to_dict()
    fixed = spec.generate([1, 2, 3], sampling=greedy, gamma=3, max_new_tokens=12).metrics
    assert fixed.schedule is None and set(fixed.gamma_counts) <= {0, 1, 2, 3}


# -- block-cost curves (CPU targets): break-even, best gamma, fallback to target-only, probing -------------------

# llama.cpp's measured block costs on this project's CPU, k tokens in single-step units
CURVE = {1: 1.0, 2: 1.6, 4: 2.6, 6: 3.7, 8: 4.5, 12: 5.7}


def curve(k: int) -> float:
    return interpolate_costs(CURVE, k)


def test_interpolated_curve():
    assert [curve(k) for k in (1, 2, 3, 4, 5, 12)] == pytest.approx([1.0, 1.6, 2.1, 2.6, 3.15, 5.7])
    assert curve(16) == pytest.approx(5.7 + 4 * (5.7 - 4.5) / 4)  # linear past the last point
    with pytest.raises(ValueError):
        curve(0)


def test_speedup_and_break_even_closed_forms():
    # gamma 1, free drafts: (1 + alpha) / 1.6 >= 1  <=>  alpha >= 0.6
    assert break_even_alpha(1, curve) == pytest.approx(0.6, abs=1e-6)
    # gamma 3: 1 + a + a^2 + a^3 = curve(4) = 2.6
    a = break_even_alpha(3, curve)
    assert 1 + a + a**2 + a**3 == pytest.approx(2.6, abs=1e-6)
    # a draft token costing 0.8 steps (the 0.5B GGUF vs the 1.5B one): gamma 1 needs (1 + a) / 2.4 >= 1: never
    assert break_even_alpha(1, curve, draft_cost=0.8) is None
    assert speedup(0.0, 0, curve) == 1.0 and speedup(1.0, 0, curve) == 1.0
    assert speedup(0.0, 4, curve) == pytest.approx(1 / 3.15)
    # the GPU picture (constant target cost): any alpha > 0 pays with free drafts
    assert speedup(0.5, 2) == pytest.approx(1.75) and break_even_alpha(1) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        break_even_alpha(0, curve)
    with pytest.raises(ValueError):
        speedup(1.5, 1)


def test_best_gamma_with_curve():
    assert best_gamma(0.5, 8, curve) == 0  # below every break-even: target-only
    assert best_gamma(0.0, 8) == 0
    g = best_gamma(0.9, 8, curve)
    assert g > 0 and speedup(0.9, g, curve) == max(speedup(0.9, h, curve) for h in range(9))
    assert best_gamma(0.99, 8, curve, draft_cost=0.8) == 0  # an expensive draft never pays on this curve


def test_adaptive_gamma_with_curve_learns_unit_cost_and_falls_back():
    s = AdaptiveGamma(gamma_max=8, target_cost=curve)
    # nothing measured yet: the best gamma for free drafts at the prior alpha 0.7 (gamma 1: 1.7 / 1.6 tokens per step)
    assert s.choose() == best_gamma(0.7, 8, curve) == 1
    s.update(drafted=8, accepted=8, draft_s=0.0, target_s=10.0)  # first round: prefill times are ignored
    assert s.c_target is None and s.c_draft is None and s.updates == 1
    for g in (1, 4, 8, 3):  # target time follows the curve with 30 ms per step: the unit cost comes out exactly
        s.update(drafted=g, accepted=0, draft_s=0.0, target_s=0.030 * curve(g + 1))
    assert s.c_target == pytest.approx(0.030) and s.c_draft == pytest.approx(0.0)
    for _ in range(60):  # an n-gram drafter that is always wrong: alpha -> 0, fall back to gamma 0
        s.update(drafted=4, accepted=0, draft_s=0.0, target_s=0.030 * curve(5))
    assert s.alpha < 0.01 and s.best() == 0 and s.choose() == 0
    # same acceptance under a constant target cost (no curve) and free drafts: drafting still "pays"
    flat = AdaptiveGamma(gamma_max=8)
    for _ in range(60):
        flat.update(drafted=4, accepted=3, draft_s=0.0, target_s=0.030)
    assert flat.best() == 8
    hi = AdaptiveGamma(gamma_max=8, target_cost=curve)
    for _ in range(60):
        hi.update(drafted=6, accepted=6, draft_s=0.0, target_s=0.030 * curve(7))
    assert hi.choose() == best_gamma(hi.alpha, 8, curve) > 0


def test_probing_backs_off_exponentially():
    """At gamma 0 the schedule probes once after 16 rounds, then 32, 64, ... up to probe_max: N = 2000 rounds
    hold 16 + 32 + 64 + 128 + 256 * k rounds; count the probes exactly (a generous overhead budget, so that only
    the interval decides here)."""
    s = AdaptiveGamma(gamma_max=8, target_cost=curve, probe_every=16, probe_max=256, overhead=0.5)
    for _ in range(3):
        s.update(drafted=4, accepted=0, draft_s=0.0, target_s=0.1 * curve(5))
    assert s.best() == 0
    picks = []
    for _ in range(2000):
        g = s.choose()
        picks.append(g)
        s.update(drafted=g, accepted=0, draft_s=0.0, target_s=0.1 * curve(g + 1))  # every probe fails
    probe_rounds = [i for i, g in enumerate(picks) if g > 0]
    gaps = [b - a for a, b in zip([-1] + probe_rounds, probe_rounds, strict=False)]
    assert gaps[:5] == [16, 32, 64, 128, 256] and set(gaps[4:]) == {256}
    assert s.probes == len(probe_rounds) == 4 + (2000 - 240) // 256
    # a probe that finds drafting paying again resets the interval
    s2 = AdaptiveGamma(gamma_max=8, target_cost=curve, probe_every=4, probe_max=64, decay=1.0, overhead=0.5)
    s2.update(drafted=4, accepted=0, draft_s=0.0, target_s=0.1)
    s2.update(drafted=4, accepted=0, draft_s=0.0, target_s=0.1 * curve(5))
    assert [s2.choose() for _ in range(3)] == [0, 0, 0]
    g = s2.choose()
    assert g > 0
    s2.update(drafted=g, accepted=g, draft_s=0.0, target_s=0.1 * curve(g + 1))  # all accepted: alpha -> 0.999
    assert s2.choose() > 0 and s2._interval == 4


def _never_paying(s: AdaptiveGamma, rounds: int, step: float, draft_s, catch_up=None) -> tuple[float, float]:
    """Run ``rounds`` decisions of ``s`` where nothing is ever accepted: a plain round costs ``step``, a block of
    k tokens ``step * (1 + 0.8 (k - 1))``, a round drafting g tokens ``draft_s(g)`` more. Returns (seconds the
    probes cost beyond the plain rounds they replaced, seconds of plain rounds)."""
    spent = plain_s = 0.0
    s.update(drafted=2, accepted=0, draft_s=0.8, target_s=0.06)  # the first round (prefill): times not used
    for _ in range(rounds):
        if catch_up is not None:
            s.catch_up = catch_up()
        probes = s.probes
        g = s.choose()
        d = draft_s(g) if g else 0.0
        target_s = step * (1 + 0.8 * g)
        s.update(drafted=g, accepted=0, draft_s=d, target_s=target_s)
        if s.probes > probes:
            spent += d + target_s - step
        elif not g:
            plain_s += target_s
    return spent, plain_s


def test_expensive_probes_stay_within_the_overhead_budget():
    """A probe whose draft must first catch up costs 20 plain rounds here (a draft model's prefill of everything
    committed since it last ran); drafting never pays. Over 5000 plain-round equivalents the probes cost at most
    3% of the time (the budget), yet the schedule keeps probing (alpha stays measured)."""
    s = AdaptiveGamma(gamma_max=8)
    step = 0.04
    spent, plain_s = _never_paying(s, 5000, step, lambda g: 20 * step)  # catch-up + drafts
    assert s.probes >= 2 and s.probe_cost_s is not None
    # the first probe runs before its cost is known; every later one is paid for by the plain rounds before it
    assert spent <= 0.03 * plain_s + s.probe_cost_s
    assert spent / (plain_s + spent) <= 0.035
    # the schedule's own account of its probes (what benchmarks report as their share of the time) is this one
    assert s.summary()["probe_spent_s"] == pytest.approx(spent, rel=1e-9)


def test_measured_block_costs_override_a_given_curve():
    """A backend's curve says a 4-token block costs 1.2 steps, but here it cost 3: the measured price wins."""
    s = AdaptiveGamma(gamma_max=8, target_cost=lambda k: 1 + 0.1 * (k - 1))
    s.update(drafted=3, accepted=0, draft_s=0.0, target_s=0.3)
    s.update(drafted=3, accepted=0, draft_s=0.0, target_s=0.3)
    s.update(drafted=0, accepted=0, draft_s=0.0, target_s=0.1)
    assert s.target_seconds(4) == pytest.approx(0.3)
    assert s.target_seconds(2) == pytest.approx(s.c_target * 1.1)  # not run: the curve's shape


def test_curve_validation():
    with pytest.raises(ValueError):
        AdaptiveGamma(target_cost=lambda k: 0.0)
    with pytest.raises(ValueError):
        AdaptiveGamma(probe_every=0)
    with pytest.raises(ValueError):
        AdaptiveGamma(alpha=2.0)


# -- decisions on a simulated cost model (no timing: seconds come from the model, acceptance from a seeded RNG) --
def _simulate(schedule: AdaptiveGamma, block: Callable[[int], float], draft: float, alpha: float, tokens: int,
              seed: int = 0) -> tuple[float, list[int]]:
    """Decode ``tokens`` tokens with ``schedule`` choosing gamma; a k-token block costs ``block(k)`` seconds, a
    drafted token ``draft``; each drafted token is accepted with probability ``alpha`` given the previous ones.
    The first round is the prefill (its times are ignored by the schedule). Returns (seconds, gammas chosen)."""
    rng = random.Random(seed)
    done, seconds, gammas = 0, 0.0, []
    while done < tokens:
        g = schedule.choose()
        gammas.append(g)
        accepted = 0
        while accepted < g and rng.random() < alpha:
            accepted += 1
        t_draft, t_target = g * draft, block(g + 1)
        schedule.update(g, accepted, t_draft, t_target)
        seconds += t_draft + t_target
        done += accepted + 1
    return seconds, gammas


def _target_only(block: Callable[[int], float], tokens: int) -> float:
    return tokens * block(1)


# the AVX2 CPU's transformers target: a 6-token block costs 5 single steps (955 ms vs 185 ms); the 0.5B draft
# costs about 0.45 of a step per token there
AVX2 = lambda k: 0.185 * (1 + 0.8 * (k - 1))  # noqa: E731
GPU = lambda k: 0.020  # noqa: E731  one step whatever k
# llama.cpp's target on the same kind of CPU (in single steps: k = 2: 1.6, 4: 2.6, 6: 3.7, 8: 4.5, 12: 5.7)
LLAMA = lambda k: 0.073 * interpolate_costs({1: 1.0, 2: 1.6, 4: 2.6, 6: 3.7, 8: 4.5, 12: 5.7}, k)  # noqa: E731


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.8])
def test_schedule_falls_back_where_no_draft_pays(alpha):
    """Drafting with the model never pays on the AVX2 curve: the schedule ends at gamma 0, within 3% of the
    target alone over 512 tokens (probes and the learning rounds included)."""
    s = AdaptiveGamma(gamma_max=8)
    seconds, gammas = _simulate(s, AVX2, draft=0.085, alpha=alpha, tokens=512)
    assert s.best() == 0 and gammas[-20:].count(0) >= 19
    assert _target_only(AVX2, 512) / seconds >= 0.97, (alpha, seconds)


def test_schedule_keeps_drafting_where_it_pays():
    """Free drafts with high acceptance (prompt lookup on code) pay on llama.cpp's block-cost curve (about 1.3x
    at best, gamma 3); a GPU-like flat block cost pays with the model draft: the schedule drafts and beats the
    target alone."""
    s = AdaptiveGamma(gamma_max=8)
    seconds, gammas = _simulate(s, LLAMA, draft=0.0, alpha=0.9, tokens=512)
    assert s.best() > 0 and _target_only(LLAMA, 512) / seconds > 1.15
    g = AdaptiveGamma(gamma_max=8)
    seconds, gammas = _simulate(g, GPU, draft=0.002, alpha=0.8, tokens=512)
    assert g.best() >= 4 and _target_only(GPU, 512) / seconds > 2.0


def test_probing_overhead_is_small_where_nothing_pays():
    """alpha = 0 (the draft is always wrong): after learning, the probes cost at most 3% over 2048 tokens."""
    s = AdaptiveGamma(gamma_max=8)
    seconds, gammas = _simulate(s, AVX2, draft=0.085, alpha=0.0, tokens=2048)
    assert _target_only(AVX2, 2048) / seconds >= 0.97
    assert s.probes >= 3  # it kept checking, ever more rarely
    assert s.summary()["curve"] == "learned" and 1 in s.summary()["block_s"]


class _ConstantCost(AdaptiveGamma):
    """The schedule before it learned the curve: every block priced at the running mean of what it measured."""

    def target_seconds(self, k: int) -> float:
        return sum(self.block_s.values()) / len(self.block_s)

    def initial(self, alphas=None, block_len=None) -> int:
        return self.gamma_max


def test_without_the_learned_curve_the_old_schedule_was_slower():
    """The same simulation under the constant-cost assumption drafts on the AVX2 curve and loses to the target
    alone: the check above can fail."""
    s = _ConstantCost(gamma_max=8)
    s.anchors = 1
    seconds, gammas = _simulate(s, AVX2, draft=0.085, alpha=0.8, tokens=512)
    assert gammas[-1] > 0 and _target_only(AVX2, 512) / seconds < 0.97


# -- batches: one decision per round for all auto rows, costs per batch size -----------------------------------
def _simulate_batch(schedule: AdaptiveGamma, rows: int, block: Callable[[int, int], float], draft: float,
                    alphas: list[float], rounds: int, seed: int = 0) -> tuple[float, int, list[int]]:
    """``rows`` rows decoded together for ``rounds`` rounds; a round of depth g costs ``g * draft`` (one batched
    draft step per depth) plus ``block(rows, g + 1)``. Returns (seconds, tokens, gammas chosen)."""
    rng = random.Random(seed)
    row_alpha = [AdaptiveGamma(8) for _ in range(rows)]
    seconds, tokens, gammas = 0.0, 0, []
    for i in range(rounds):
        g = schedule.choose([a.alpha for a in row_alpha])
        gammas.append(g)
        for a, true_alpha in zip(row_alpha, alphas, strict=True):
            acc = 0
            while acc < g and rng.random() < true_alpha:
                acc += 1
            a.observe_acceptance(g, acc)
            tokens += acc + 1
        t = g * draft + block(rows, g + 1)
        if i:  # round 0 ran the prefill
            schedule.observe_costs(g, g * draft, block(rows, g + 1))
        seconds += t
    return seconds, tokens, gammas


def _cpu_batch(rows: int, k: int) -> float:
    """A CPU target: a block of n = rows * k tokens costs llama.cpp's curve up to 8 tokens, and past that grows in
    proportion to n (compute-bound: the weights' reads are already shared)."""
    n = rows * k
    return LLAMA(n) if n <= 8 else LLAMA(8) * n / 8


def test_batch_schedule_drafts_less_when_rows_fill_the_block():
    """Free drafts with acceptance 0.9 pay for one row on the CPU curve (gamma > 0), but for 8 rows the block is
    already 8 tokens wide and drafting multiplies its cost: the batch schedule settles on 0 and stays within 3%
    of the batch decoding alone (200 rounds, seed 0)."""
    one = AdaptiveGamma(gamma_max=8)
    _simulate_batch(one, 1, _cpu_batch, 0.0, [0.9], 200)
    assert one.best([0.9]) > 0
    eight = AdaptiveGamma(gamma_max=8)
    seconds, tokens, gammas = _simulate_batch(eight, 8, _cpu_batch, 0.0, [0.9] * 8, 200)
    assert gammas[-20:].count(0) >= 19
    alone = _cpu_batch(8, 1) / 8  # seconds per token of the batch without drafts
    assert alone / (seconds / tokens) >= 0.97


def test_batch_schedule_weighs_every_rows_acceptance():
    """On a flat (GPU-like) block cost the best depth for a batch follows the rows' acceptances together: four
    rows at 0.9 draft deeper than one row at 0.9 with three at 0.1, and the decision is the sum's argmax."""
    s = AdaptiveGamma(gamma_max=8)
    s.c_draft, s.c_target, s.block_s = 0.002, 0.02, {1: 0.02, 8: 0.02}
    high, mixed = s.best([0.9] * 4), s.best([0.9, 0.1, 0.1, 0.1])
    assert high > mixed >= 1
    rates = [sum(expected_tokens(a, g) for a in [0.9, 0.1, 0.1, 0.1]) / s.round_cost(g) for g in range(9)]
    assert mixed == max(range(9), key=lambda g: (rates[g], -g))


# -- trees: the block is the tree's node count, not its depth ----------------------------------------------------
def test_tree_depth_schedule_prices_the_nodes():
    """A static binary tree of depth d holds 2 + 4 + ... + 2^d nodes; on the CPU curve (cost grows with tokens)
    the schedule stays shallow where a chain of the same per-depth acceptance could go deeper, and on a flat
    cost it goes deep."""
    nodes = lambda d: sum(2**i for i in range(1, d + 1))  # noqa: E731
    tree = AdaptiveGamma(gamma_max=6, block_len=lambda g: nodes(g) + 1)
    chain = AdaptiveGamma(gamma_max=6)
    for s in (tree, chain):
        s.c_draft, s.c_target = 0.0, LLAMA(1)
        s.block_s = {k: LLAMA(k) for k in (1, 2, 4, 8, 16, 32, 64, 128)}
    assert tree.best([0.9]) < chain.best([0.9])
    flat = AdaptiveGamma(gamma_max=6, block_len=lambda g: nodes(g) + 1)
    flat.c_draft, flat.c_target, flat.block_s = 0.001, 0.02, {1: 0.02, 127: 0.02}
    assert flat.best([0.9]) == 6


def test_tree_drafter_node_counts():
    """The tree drafter's node count per depth, which prices a depth for the schedule."""
    from verispec.drafters.tree import TreeDrafter

    t = object.__new__(TreeDrafter)
    t.top_k, t.width, t.budget = 2, None, None
    assert [t.nodes(d) for d in range(5)] == [0, 2, 6, 14, 30]
    t.top_k, t.width, t.budget = 3, 2, 10  # dynamic: 3, then 2 expanded x 3 = 6 per level, at most 10
    assert [t.nodes(d) for d in range(5)] == [0, 3, 9, 10, 10]


def test_drafter_rounds_share_one_decision_and_skip_prefill_costs():
    """The drafters' bookkeeping: auto rows of one round get one depth (fixed rows keep theirs), the round's costs
    go to the schedule of its batch size once every row reported, and a round that ran a prefill is left out."""
    from verispec.core.rules import get
    from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal

    class Sim(BaseDrafter):
        def draft(self, requests, lengths):
            return [Proposal([1] * g, seconds=0.01 * max(lengths)) for g in lengths]

    d = Sim(gamma_max=8)
    d.add_row(1, "auto")
    d.add_row(2, "auto")
    d.add_row(3, 4)
    cfg, rule = SamplingConfig(temperature=0.0), get("lossless")
    reqs = [DraftRequest(k, [5, 6], 16, cfg, rule, None, None, False) for k in (1, 2, 3)]
    for rnd in range(3):
        props = d.propose(reqs)
        assert len(props[0]) == len(props[1]) and len(props[2]) == 4
        sched = d.schedule(3)
        for k, p in zip((1, 2, 3), props, strict=True):
            assert sched.c_target is None or rnd > 0  # nothing folded in before the round completes
            d.update(k, p, 0, target_s=0.3)
        assert (sched.c_target is None) == (rnd == 0)  # round 0 ran the prefill
    assert sched.block_s == {5: pytest.approx(0.3)}  # the padded block: the fixed row's 4 drafts + 1
    assert d.schedule_summary(1)["batch_sizes"] == [3] and d.schedule_summary(3) is None
    d.remove_row(3)
    assert d.lengths(reqs[:2])[0] == d.lengths(reqs[:2])[1]


# -- tree width: chosen with the depth, measured for every narrower width from one round ---------------------------
def _width_drafter(top_k: int = 3):
    from verispec.drafters.tree import TreeDrafter

    d = TreeDrafter(HFBackend(tiny_qwen(1, vocab_size=64)), depth=4, top_k=top_k)
    d.add_row(1, "auto")
    return d


def _brute_force(d, sched, alphas: dict[int, float]) -> tuple[int, int, float]:
    """(depth, width, rate) maximising expected tokens per second over every shape the drafter can draft."""
    shapes = [(g, w) for w in d.widths for g in range(sched.gamma_max + 1)]
    rate = lambda g, w: expected_tokens(alphas[w], g) / sched.round_cost(g, lambda x: d.nodes(x, w) + 1)  # noqa: E731
    g, w = max(shapes, key=lambda s: (rate(*s), -s[0], -s[1]))
    return g, w, rate(g, w)


@pytest.mark.parametrize("curve,alphas,width,depth", [
    # CPU (block cost grows with tokens): a wider tree's small gain in acceptance does not pay for its nodes
    (LLAMA, {1: 0.8, 2: 0.85, 3: 0.87}, 1, None),
    # flat (GPU-like): nodes are free, so the widest, deepest tree
    (GPU, {1: 0.5, 2: 0.7, 3: 0.8}, 3, 4),
    # a block cost that grows slowly (5% a token) and a draft that is often second-best: width 2 pays, 3 does not
    (lambda k: 0.02 * (1 + 0.05 * (k - 1)), {1: 0.3, 2: 0.9, 3: 0.91}, 2, None),
])
def test_tree_width_is_chosen_with_the_depth(curve, alphas, width, depth):
    """On a simulated cost model, the tree drafter's (depth, width) decision is the argmax over every shape of
    the expected tokens per second, with the per-width acceptances."""
    d = _width_drafter()
    sched = d.schedule(1)
    sched.c_draft, sched.c_target = 0.001, curve(1)
    sched.block_s = {k: curve(k) for k in (1, 2, 4, 8, 16, 32, 64, 128)}
    for w, a in alphas.items():
        d._alpha_w[1][w].alpha = a
    g = d.decide(sched, [1])
    want = _brute_force(d, sched, alphas)
    assert (g, d.last_width) == want[:2] and g >= 1 and d.last_width == width
    assert depth is None or g == depth


def test_tree_width_acceptance_is_measured_from_sibling_ranks():
    """A width-2 tree whose accepted path takes the second child at depth 2: a chain (width 1) would have stopped
    after one token, width 2 accepted both; a width-3 estimate is left alone (no such tree ran)."""
    from verispec.drafters.base import Proposal

    d = _width_drafter()
    # root -> 0 (rank 0), 1 (rank 1); 0 -> 2 (rank 0), 3 (rank 1); 1 -> 4, 5
    prop = Proposal([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 1, 1], meta={"slots": {}, "width": 2})
    d.commit(1, prop, [0, 3])
    d.update(1, prop, 2, target_s=0.01)
    est = d._alpha_w[1]
    assert est[1].alpha == pytest.approx(0.9 * 0.7 + 0.1 * 0.5)  # kept 1 of the 2 depths reached
    assert est[2].alpha == pytest.approx(0.9 * 0.7 + 0.1 * 1.0)  # kept both
    assert est[3].alpha == 0.7 and est[3].updates == 0


def test_tree_auto_width_keeps_greedy_exact():
    """gamma='auto' on a static top-3 tree: whatever (depth, width) each round takes, greedy output is the
    target's own; the report names the width and every width's acceptance."""
    target = tiny_qwen(1, vocab_size=64, logit_scale=4)
    draft = tiny_qwen(2, vocab_size=64, logit_scale=4)
    from verispec.drafters.tree import TreeDrafter

    plain = SpeculativeEngine(HFBackend(target), None)
    spec = SpeculativeEngine(HFBackend(target), TreeDrafter(HFBackend(draft), depth=4, top_k=3))
    greedy = SamplingConfig(temperature=0)
    for prompt in ([1, 2, 3], [40, 2, 9, 13, 5]):
        ref = plain.generate(prompt, sampling=greedy, gamma=0, max_new_tokens=24).token_ids
        out = spec.generate(prompt, sampling=greedy, gamma="auto", max_new_tokens=24)
        assert out.token_ids == ref
        sched = out.metrics.schedule
        assert sched["width"] in (1, 2, 3) and set(sched["alpha_by_width"]) == {1, 2, 3}


def test_hybrid_prices_lookups_and_model_drafts_apart():
    """Prompt lookup, else a draft model, under gamma='auto': on a simulated cost model where model drafts cost
    far more than they gain (costly, never accepted) and look-ups are free and always accepted, rounds whose
    history has a match keep drafting and the others fall back to 0 drafts; one shared cost model would have
    priced the free look-ups like model drafts."""
    from verispec.core.rules import get
    from verispec.drafters import HybridDrafter
    from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal

    class SlowModel(BaseDrafter):
        def draft(self, requests, lengths):
            return [Proposal([1] * g, seconds=0.2 * g) for g in lengths]

    d = HybridDrafter(SlowModel(gamma_max=8), min_ngram=1)
    d.add_row(1, "auto")
    cfg, rule = SamplingConfig(temperature=0.0), get("lossless")
    match = DraftRequest(1, [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5], 64, cfg, rule)  # "5" occurred: look up "6 7 8 9"
    fresh = DraftRequest(1, list(range(10, 21)), 64, cfg, rule)  # no earlier occurrence of the last token
    chosen: dict[str, list[int]] = {"lookup": [], "model": []}
    for rnd in range(200):
        req = match if rnd % 2 else fresh
        (prop,) = d.propose([req])
        kind = prop.meta.get("kind", "model")
        chosen[kind].append(len(prop))
        accepted = len(prop) if kind == "lookup" else 0
        d.update(1, prop, accepted, target_s=LLAMA(len(prop) + 1))
    assert chosen["lookup"][-20:].count(0) == 0 and min(chosen["lookup"][-20:]) >= 2
    assert chosen["model"][-50:].count(0) >= 48
    summary = d.schedule_summary(1)
    assert summary["lookup"]["alpha"] > 0.9 and summary["alpha"] < 0.7 and summary["best"] == 0  # model: probed, lost


def test_a_probe_is_priced_by_what_the_draft_must_take_in():
    """A draft model that sat out catches up on every token since it last ran before it drafts, so a probe's cost
    grows with that catch-up (the whole prompt for a new request). Here taking in a token costs half a plain step
    and drafting never pays; rounds with a catch-up of 10 and of 400 tokens mix (seeded). The schedule prices a
    probe by the last one's cost per token taken in: over 20000 rounds the probes stay within 3% of the time and
    still run about every probe_max rounds (alpha stays measured); once a cheap probe has been measured, a round
    that would catch up 400 tokens does not probe where one catching up 10 does."""
    import random

    rng = random.Random(0)
    s = AdaptiveGamma(gamma_max=8)
    step = 0.04

    def draft_s(g: int) -> float:
        return 0.02 * s.catch_up + 0.01 * g

    spent, plain_s = _never_paying(s, 20000, step, draft_s, lambda: rng.choice([10, 10, 10, 400]))
    assert spent / (plain_s + spent) <= 0.03
    assert s.probes >= 20000 // s.probe_max - 2
    assert s.probe_s_per_token == pytest.approx((0.02 * 10 + 0.01 + 0.8 * step) / 11)
    s._zeros = s._interval  # a probe is due
    s.budget_s = 50 * s.probe_s_per_token  # covers a catch-up of 10 tokens, not of 400
    s.catch_up = 400
    assert s.choose() == 0
    s._zeros = s._interval
    s.catch_up = 10
    assert s.choose() >= 1


def test_a_new_requests_first_probe_is_priced_by_the_drafts_prefill():
    """A draft that never pays, behind a schedule shared across requests: the first request drafts in its prefill
    round, where the draft takes in its 300-token prompt (0.02 s a token here, a plain step 0.04 s) and that price
    is recorded. The second request starts at gamma 0 (the schedule already knows drafting does not pay), so a probe
    would first take in its whole prompt (about 6 s, 150 plain steps): over 200 rounds the budget (3%) never
    covers that, and no probe runs. Without the recorded price the same schedule would probe at once."""
    from verispec.core.rules import get
    from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal

    step = 0.04

    class Sim(BaseDrafter):
        seen: dict[int, int] = {}

        def catch_up(self, requests):
            return max(len(r.ids) - self.seen.get(r.key, 0) for r in requests)

        def draft(self, requests, lengths):
            out = []
            for r, g in zip(requests, lengths, strict=True):
                cost = 0.02 * (len(r.ids) - self.seen.get(r.key, 0)) + 0.01 * g if g else 0.0
                if g:
                    self.seen[r.key] = len(r.ids)
                out.append(Proposal([1] * g, seconds=cost))
            return out

    d = Sim(gamma_max=8)
    cfg, rule = SamplingConfig(temperature=0.0), get("lossless")

    def run(key: int, rounds: int) -> list[int]:
        d.add_row(key, "auto")
        ids, gammas = list(range(300)), []
        for _ in range(rounds):
            (prop,) = d.propose([DraftRequest(key, list(ids), 512, cfg, rule, None, None, False)])
            gammas.append(len(prop))
            d.update(key, prop, 0, target_s=step * (1 + 0.8 * len(prop)))
            ids.append(7)  # nothing accepted: one token a round
        d.remove_row(key)
        return gammas

    first = run(1, 60)
    s = d.schedule(1)
    assert first[0] > 0 and s.ingest_s_per_token == pytest.approx((0.02 * 300 + 0.01 * first[0]) / (300 + first[0]))
    assert s.best() == 0 and s.probes == 0
    second = run(2, 200)
    assert second == [0] * 200 and s.probes == 0 and s.probe_spent_s == 0
    s._zeros, s.ingest_s_per_token, s.catch_up = s._interval, None, 316  # the same due probe, unpriced: it runs
    assert s.choose() >= 1


# -- rows that find nothing to draft, and where a new row starts ---------------------------------------------------
def test_expected_tokens_with_a_hit_rate():
    """1 + hit * sum_{i=1}^{gamma} alpha^i: a round without a draft yields the target's one token."""
    for alpha, g, hit in ((0.6, 3, 0.5), (0.9, 5, 0.0), (0.3, 0, 0.7)):
        assert expected_tokens(alpha, g, hit) == pytest.approx(1 + hit * (expected_tokens(alpha, g) - 1))
    assert expected_tokens(0.9, 5, 0.0) == 1.0


def test_rounds_without_a_draft_lower_the_hit_rate_not_alpha():
    """A row asked for 4 tokens that drafts none in every other round: alpha follows only the rounds that drafted
    (all accepted here), hit is the running share of rounds that drafted; a round not asked to draft moves
    neither."""
    s = AdaptiveGamma(gamma_max=8, alpha=0.5)
    for i in range(200):
        s.observe_acceptance(4 if i % 2 else 0, 4 if i % 2 else 0, asked=4)
    assert s.alpha > 0.99 and s.hit == pytest.approx(0.5, abs=0.06)
    assert s.drafted_rounds == 100 and s.asked_rounds == 200
    before = (s.alpha, s.hit)
    s.observe_acceptance(0, 0, asked=0)
    s.observe_acceptance(0, 0)
    assert (s.alpha, s.hit) == before


def test_batch_decision_counts_rows_that_find_no_draft():
    """Four rows at alpha 0.55 on a CPU-like cost (a 2-token block costs 1.3 plain steps, drafts free): drafting one
    token pays if every row drafts (4 * 1.55 / 1.3 > 4), not if each finds a draft in 40% of its rounds
    (4 * (1 + 0.4 * 0.55) / 1.3 < 4); the decision is the argmax of the batch's expected tokens per second."""
    s = AdaptiveGamma(gamma_max=4)
    s.c_draft, s.c_target, s.block_s = 0.0, 0.25, {1: 0.25, 2: 0.325, 5: 0.8}
    assert s.best([0.55] * 4) >= 1
    assert s.best([0.55] * 4, hits=[0.4] * 4) == 0
    for hits in ([1.0, 0.4, 0.4, 0.4], [0.9, 0.8, 0.7, 1.0]):
        rates = [sum(expected_tokens(0.55, g, h) for h in hits) / s.round_cost(g) for g in range(5)]
        assert s.best([0.55] * 4, hits=hits) == max(range(5), key=lambda g: (rates[g], -g))
    with pytest.raises(ValueError, match="hit"):
        s.rate(1, [0.5, 0.5], hits=[1.0])


def test_prompt_lookup_rows_without_matches_stop_pulling_the_batch_to_draft():
    """Prompt lookup under gamma='auto' with four rows, simulated costs (a round of depth g costs 1 + 0.3 g plain
    steps): two rows always find a match and accept its first token in every other round (alpha about 0.5 or
    less), two never find one (no repeated token). Their hit rate falls towards 0, their alpha stays at the prior
    (nothing measured it), and the schedule settles on 0 drafts: one draft gives at most 2 * 1.5 + 2 = 5 tokens for
    1.3 steps, below 4 plain tokens a step. Counted as rows accepting at the prior 0.7 (hit 1, as before), the same
    estimates would still say drafting pays."""
    from verispec.core.rules import get
    from verispec.drafters import NgramDrafter
    from verispec.drafters.base import DraftRequest

    d = NgramDrafter(max_ngram=1, gamma_max=4)
    cfg, rule = SamplingConfig(temperature=0.0), get("lossless")
    hist = {1: [5, 6] * 20, 2: [5, 6] * 20, 3: list(range(100, 140)), 4: list(range(200, 240))}
    for k in hist:
        d.add_row(k, "auto")
    gammas = []
    for rnd in range(300):
        reqs = [DraftRequest(k, list(ids), 64, cfg, rule) for k, ids in hist.items()]
        props = d.propose(reqs)
        depth = max(len(p) for p in props)
        gammas.append(depth)
        for k, p in zip(hist, props, strict=True):
            d.update(k, p, min(len(p), rnd % 2), target_s=0.25 * (1 + 0.3 * depth))
        for k in (3, 4):  # fresh tokens: still no match next round
            hist[k].append(hist[k][-1] + 1)
    rows = [d._gamma[k] for k in hist]
    assert rows[2].hit < 0.2 and rows[2].drafted_rounds == 0 and rows[2].alpha == 0.7
    assert rows[0].hit == 1.0 and rows[0].alpha <= 0.6
    assert gammas[-50:].count(0) >= 48
    assert d.schedule(4).best([r.alpha for r in rows]) >= 1  # without the hit rates: drafting would look worth it


def test_a_new_row_starts_from_the_rows_that_finished():
    """A row that measured alpha near 0 and hit 0.5 moves the prior of the next row by its weight; a row that never
    drafted (alpha unmeasured) leaves the prior's alpha where it was; kinds of estimate keep priors of their own."""
    from verispec.drafters.base import BaseDrafter, RowPrior

    d = BaseDrafter(gamma_max=8)
    d.add_row(1, "auto")
    est = d._gamma[1]
    for i in range(100):
        est.observe_acceptance(3 if i % 2 else 0, 0, asked=3)
    d.remove_row(1)
    prior = RowPrior()
    w = prior.weight
    d.add_row(2, "auto")
    assert d._gamma[2].alpha == pytest.approx(0.7 + w * (est.alpha - 0.7))
    assert d._gamma[2].hit == pytest.approx(1.0 + w * (est.hit - 1.0))
    alpha2 = d._gamma[2].alpha
    d._gamma[2].observe_acceptance(0, 0, asked=2)  # asked, drafted nothing: hit measured, alpha not
    d.remove_row(2)
    d.add_row(3, "auto")
    assert d._gamma[3].alpha == pytest.approx(alpha2) and d._gamma[3].hit < prior.hit
    assert d.new_estimate("lookup").alpha == 0.7  # another kind: its own prior
    d.add_row(4, 3)
    d.remove_row(4)  # a constant-gamma row has no estimate to pool
    assert d.new_estimate().alpha == pytest.approx(alpha2)
