"""Verification rules: registry, the tutorial's worked example, and exact properties of the induced distributions.

Everything here is exact arithmetic (float64, tolerance 1e-12 unless stated), no sampling. Property tests use
hypothesis with ``derandomize=True`` (a fixed, reproducible example sequence) and a few hundred examples.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verispec import rules
from verispec.analysis import (
    acceptance_probability,
    cos_we_closed_form,
    induced_distribution,
    lenience_closed_form,
    truncation_closed_form,
    tv,
)
from verispec.core.rules.collaborative import (
    AdaptiveInterpolation,
    Ceiling,
    CosCD,
    CosWE,
    Lenience,
    MinPCap,
    OvershootCeiling,
    lenience_delta,
)
from verispec.core.rules.lossless import EtaSampling, Lossless, MinPSampling, NaiveResample
from verispec.core.rules.truncation import SpecCascade, Typical
from verispec.core.sampling import eta_mask, minp_mask, renormalize_on
from verispec.testing import RULE_CONFIGS

TOL = 1e-12
PROPS = settings(
    max_examples=250, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

P = [0.6, 0.3, 0.1]
Q = [0.2, 0.5, 0.3]



def d(x: object) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def maxdiff(a: torch.Tensor, b: object) -> float:
    return float((d(a) - d(b)).abs().max())


# ----------------------------------------------------------------------------------------------- strategies


def _normalize(w: list[float]) -> list[float]:
    s = sum(w)
    return [x / s for x in w]


_weight = st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.floats(0.5, 1.0))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (p, q) over V in 2..12: zeros allowed in either, plus p = q, one-hot q and near-equal pairs."""
    v = draw(st.integers(2, 12))
    wp = draw(st.lists(_weight, min_size=v, max_size=v).filter(lambda w: sum(w) > 0))
    p = _normalize(wp)
    kind = draw(st.sampled_from(["random", "random", "random", "equal", "onehot", "near"]))
    if kind == "equal":
        q = list(p)
    elif kind == "onehot":
        q = [0.0] * v
        q[draw(st.integers(0, v - 1))] = 1.0
    elif kind == "near":
        eps = draw(st.floats(1e-9, 1e-3))
        q = _normalize([x + eps * (i % 3) for i, x in enumerate(p)])
    else:
        wq = draw(st.lists(_weight, min_size=v, max_size=v).filter(lambda w: sum(w) > 0))
        q = _normalize(wq)
    return d(p), d(q)


def assert_distribution(x: torch.Tensor) -> None:
    assert torch.isfinite(x).all(), x
    assert (x >= 0).all(), x
    assert abs(float(x.sum()) - 1) < TOL, float(x.sum())


# ----------------------------------------------------------------------------------------------- registry


def test_registry_names_and_classes():
    assert rules.names() == list(rules.REGISTRY)
    expected = {
        "lossless": Lossless, "naive-resample": NaiveResample, "minp-sampling": MinPSampling,
        "eta-sampling": EtaSampling, "lenience": Lenience, "cos-we": CosWE, "cos-cd": CosCD,
        "overshoot-ceiling": OvershootCeiling, "adaptive-interpolation": AdaptiveInterpolation,
        "ceiling": Ceiling, "minp-cap": MinPCap, "spec-cascade": SpecCascade, "typical": Typical,
    }
    assert rules.REGISTRY == expected
    for name, cls in expected.items():
        assert type(rules.get(name)) is cls
        assert cls.name == name


def test_get_with_params_and_aliases():
    assert rules.get("lenience", l=0.25).l == 0.25
    assert rules.get("cos-we", **{"lambda": 0.3}).lam == 0.3
    assert rules.get("cos-we", lam=0.3) == rules.get("cos-we", **{"lambda": 0.3})
    assert rules.get("typical", eps=0.2).epsilon == 0.2
    assert rules.get("spec-cascade", correction="target").correction_source == "target"
    assert rules.get("typical", correction="draft").correction_source == "draft"
    r = rules.get("minp-cap", p_base=0.3, l=0.7)
    assert r.params == {"p_base": 0.3, "l": 0.7, "realization": "normalized"}
    assert r.describe() == "minp-cap(p_base=0.3, l=0.7, realization=normalized)"
    assert rules.get(r) is r


def test_unknown_rule():
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        rules.get("nope")


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("lossless", {"l": 0.5}, "l"),
        ("lenience", {"lam": 0.5}, "lam"),
        ("cos-we", {"l": 0.5}, "l"),
        ("minp-sampling", {"epsilon": 0.1}, "epsilon"),
        ("spec-cascade", {"foo": 1}, "foo"),
    ],
)
def test_unknown_param_names_it(name, params, needle):
    with pytest.raises(ValueError, match=rf"no parameter\(s\) {needle}"):
        rules.get(name, **params)


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("lenience", {"l": 0.0}, "l "),
        ("lenience", {"l": 1.5}, "l "),
        ("lenience", {"l": float("nan")}, "l "),
        ("lenience", {"l": "abc"}, "l "),
        ("cos-we", {"lam": -0.1}, "lam"),
        ("cos-we", {"lambda": 1.1}, "lam"),
        ("cos-cd", {"lam": 2.0}, "lam"),
        ("cos-cd", {"q_floor": 0.0}, "q_floor"),
        ("cos-cd", {"q_floor": "abc"}, "q_floor"),
        ("overshoot-ceiling", {"lam": 0.0}, "lam"),
        ("adaptive-interpolation", {"lam": 0.0}, "lam"),
        ("minp-sampling", {"p_base": 0.0}, "p_base"),
        ("minp-sampling", {"p_base": 1.2}, "p_base"),
        ("minp-cap", {"p_base": -1}, "p_base"),
        ("minp-cap", {"l": 0}, "l "),
        ("eta-sampling", {"epsilon": 0.0}, "epsilon"),
        ("eta-sampling", {"delta": 1.5}, "delta"),
        ("spec-cascade", {"p_base": float("inf")}, "p_base"),
        ("spec-cascade", {"correction": "both"}, "correction"),
        ("typical", {"epsilon": 2.0}, "epsilon"),
        ("typical", {"delta": -0.1}, "delta"),
        ("typical", {"correction": "q"}, "correction"),
    ],
)
def test_out_of_range_param_names_it(name, params, needle):
    with pytest.raises(ValueError, match=needle):
        rules.get(name, **params)


def test_parse_params():
    assert rules.parse_params(["l=0.5", "lambda = 0.2", "delta=none", "correction=target"]) == {
        "l": 0.5, "lambda": 0.2, "delta": None, "correction": "target",
    }
    with pytest.raises(ValueError, match="name=value"):
        rules.parse_params(["l0.5"])
    with pytest.raises(ValueError, match="name=value"):
        rules.parse_params(["=0.5"])


def test_matched_baseline():
    assert rules.matched_baseline(rules.get("spec-cascade", p_base=0.3)) == MinPSampling(p_base=0.3)
    assert rules.matched_baseline(rules.get("typical", epsilon=0.2, delta=0.4)) == EtaSampling(epsilon=0.2, delta=0.4)
    mp = rules.get("minp-sampling", p_base=0.4)
    assert rules.matched_baseline(mp) is mp
    for name in ("lossless", "naive-resample", "lenience", "cos-we", "cos-cd", "minp-cap"):
        assert rules.matched_baseline(rules.get(name)) == Lossless()


def test_table():
    rows = rules.table()
    assert [r["name"] for r in rows] == rules.names()
    for row in rows:
        assert set(row) == {"name", "params", "equation", "lossless"}
        assert row["equation"]
        assert row["lossless"] == ("yes" if rules.REGISTRY[row["name"]].lossless else "no")
    assert {r["name"] for r in rows if r["lossless"] == "yes"} == {"lossless", "minp-sampling", "eta-sampling"}


# ----------------------------------------------------------------------------------------------- worked example


def test_worked_example_lossless_induces_p():
    out = induced_distribution("lossless", P, Q)
    assert maxdiff(out, P) < TOL
    # accept path min(p, q) = [0.2, 0.3, 0.1]; the 0.4 rejected mass all goes to token 0
    r = Lossless()
    assert maxdiff(d(Q) * r.acceptance(d(P), d(Q)), [0.2, 0.3, 0.1]) < TOL
    assert maxdiff(r.correction(d(P), d(Q)), [1.0, 0.0, 0.0]) < TOL
    assert abs(float(acceptance_probability(r, P, Q)) - 0.6) < TOL


def test_the_exact_analysis_refuses_what_is_not_a_distribution():
    """induced_distribution checks p and q as the samplers do; Eq. 13 where q has no mass on the allowed set is
    undefined (the rule falls back there), a ValueError rather than NaN."""
    with pytest.raises(ValueError, match="p has negative entries"):
        induced_distribution("lossless", [0.5, 0.6, -0.1, 0.0], [0.25, 0.25, 0.25, 0.25])
    with pytest.raises(ValueError, match="q rows must sum to 1"):
        induced_distribution("lossless", [0.5, 0.5, 0.0, 0.0], [0.5, 0.6, 0.0, 0.0])
    with pytest.raises(ValueError, match="no mass on the allowed set"):
        truncation_closed_form(d([0.0, 0.0, 0.5, 0.5]), torch.tensor([True, True, False, False]))


def test_worked_example_naive_resample():
    out = induced_distribution("naive-resample", P, Q)
    assert maxdiff(out, [0.44, 0.42, 0.14]) < TOL


def test_worked_example_one_hot_draft():
    q1 = [0.0, 1.0, 0.0]
    assert abs(float(acceptance_probability("lossless", P, q1)) - 0.3) < TOL
    assert maxdiff(induced_distribution("lossless", P, q1), P) < TOL
    # residual: token 1 removed, the rest renormalized by p
    assert maxdiff(Lossless().correction(d(P), d(q1)), [6 / 7, 0.0, 1 / 7]) < TOL


# ----------------------------------------------------------------------------------------------- exact properties


@PROPS
@given(pairs())
def test_lossless_induces_p_and_acceptance_is_one_minus_tv(pq):
    p, q = pq
    assert maxdiff(induced_distribution("lossless", p, q), p) < TOL
    assert abs(float(acceptance_probability("lossless", p, q)) - (1 - float(tv(p, q)))) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.05, 0.1, 0.3, 0.5, 0.9, 1.0]), st.sampled_from([0.01, 0.1, 0.3, 1.0]),
       st.sampled_from([None, 0.05, 0.5, 1.0]))
def test_truncation_baselines_induce_p_theta(pq, p_base, epsilon, delta):
    p, q = pq
    mp = rules.get("minp-sampling", p_base=p_base)
    pt = renormalize_on(p, minp_mask(p, p_base))
    assert maxdiff(mp.target(p), pt) < TOL
    assert maxdiff(induced_distribution(mp, p, q), pt) < TOL
    # the draft truncated by the same strategy (as a warper on both models) still yields p_Theta
    assert maxdiff(induced_distribution(mp, p, mp.draft(q)), pt) < TOL
    et = rules.get("eta-sampling", epsilon=epsilon, delta=delta)
    pt = renormalize_on(p, eta_mask(p, epsilon, delta))
    assert maxdiff(induced_distribution(et, p, q), pt) < TOL
    assert maxdiff(induced_distribution(et, p, et.draft(q)), pt) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))
def test_cos_we_eq8(pq, lam):
    p, q = pq
    assert maxdiff(induced_distribution(rules.get("cos-we", lam=lam), p, q), cos_we_closed_form(p, q, lam)) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.1, 0.3, 0.5, 0.9, 1.0]))
def test_lenience_eq10_11(pq, l):
    p, q = pq
    rule = rules.get("lenience", l=l)
    closed, delta = lenience_closed_form(p, q, l)
    assert maxdiff(induced_distribution(rule, p, q), closed) < TOL
    # Delta: TV form (Eq. 11) equals the ratio form sum(q - min(q, p/l)) / sum(q - min(q, p)) and lies in [0, 1]
    ratio = lenience_delta(p, q, l).squeeze(-1)
    if float(tv(p, q)) > 1e-3:
        assert abs(float(delta) - float(ratio)) < 1e-10
    assert -TOL <= float(ratio) <= 1 + TOL
    if l == 1.0:
        assert maxdiff(closed, p) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.05, 0.2, 0.5, 0.9]), st.sampled_from([0.02, 0.1, 0.4]))
def test_truncation_verification_eq13_and_target_correction(pq, p_base, epsilon):
    p, q = pq
    for strategy, allowed, kw in (
        ("spec-cascade", minp_mask(p, p_base), {"p_base": p_base}),
        ("typical", eta_mask(p, epsilon), {"epsilon": epsilon}),
    ):
        pt = renormalize_on(p, allowed)
        zq = float(q[allowed].sum())
        out = induced_distribution(rules.get(strategy, **kw), p, q)
        if zq > 0:
            assert maxdiff(out, truncation_closed_form(q, allowed)) < TOL
        else:  # Eq. 13 undefined: the rule emits p_Theta (documented fallback)
            assert maxdiff(out, pt) < TOL
        out_t = induced_distribution(rules.get(strategy, correction="target", **kw), p, q)
        expect = torch.where(allowed, q, torch.zeros_like(q)) + (1 - zq) * pt
        assert maxdiff(out_t, expect) < TOL


@PROPS
@given(pairs())
def test_naive_resample_closed_form(pq):
    p, q = pq
    m = torch.minimum(p, q)
    assert maxdiff(induced_distribution("naive-resample", p, q), m + (1 - m.sum()) * p) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.2, 0.5, 1.0]))
def test_cos_cd_induces_its_normalized_reference(pq, lam):
    p, q = pq
    rule = rules.get("cos-cd", lam=lam)
    ref = rule.reference(p, q)
    assert abs(float(ref.sum()) - 1) < TOL
    assert maxdiff(induced_distribution(rule, p, q), ref) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.3, 0.7]), st.sampled_from([0.2, 0.6]))
def test_minp_cap_accept_path(pq, p_base, l):
    # residual realization: accept path q on the min-p set A of p, min(q, p/l) outside it (App. E)
    p, q = pq
    rule = rules.get("minp-cap", p_base=p_base, l=l, realization="residual")
    inside = minp_mask(p, p_base)
    accept = q * rule.acceptance(p, q)
    assert maxdiff(accept, torch.where(inside, q, torch.minimum(q, p / l))) < TOL


@PROPS
@given(pairs())
def test_every_rule_induces_a_distribution(pq):
    p, q = pq
    for name, params in RULE_CONFIGS:
        rule = rules.get(name, **params)
        h = rule.acceptance(p, q)
        assert ((h >= 0) & (h <= 1)).all(), name
        assert_distribution(rule.correction(p, q))
        out = induced_distribution(rule, p, q)
        assert_distribution(out)
        acc = float(acceptance_probability(rule, p, q))
        assert -TOL <= acc <= 1 + TOL
        if rule.lossless:
            assert maxdiff(out, rule.target(p)) < TOL, name
        assert_distribution(rule.bonus(p))


def test_batched_induced_matches_rows():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 9, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(4, 9, generator=g, dtype=torch.float64) * 2, -1)
    for name, params in RULE_CONFIGS:
        rule = rules.get(name, **params)
        out = induced_distribution(rule, p, q)
        for i in range(4):
            assert maxdiff(out[i], induced_distribution(rule, p[i], q[i])) < TOL, name


# ----------------------------------------------------------------------------------------------- lossy is lossy

P5 = [0.5, 0.25, 0.15, 0.07, 0.03]
Q5 = [0.2, 0.35, 0.05, 0.3, 0.1]


@pytest.mark.parametrize(("name", "params"), [c for c in RULE_CONFIGS if not rules.REGISTRY[c[0]].lossless])
def test_lossy_rules_differ_from_p(name, params):
    rule = rules.get(name, **params)
    out = induced_distribution(rule, P5, Q5)
    assert float(tv(out, P5)) > 1e-3
    # and from their matched truncated target, which is what they should be judged against
    assert float(tv(out, rules.matched_baseline(rule).target(d(P5)))) > 1e-3


@pytest.mark.parametrize(("name", "params"), [c for c in RULE_CONFIGS if rules.REGISTRY[c[0]].lossless])
def test_lossless_rules_match_target_on_fixed_pair(name, params):
    rule = rules.get(name, **params)
    assert maxdiff(induced_distribution(rule, P5, Q5), rule.target(d(P5))) < TOL


# ----------------------------------------------------------------------------------------------- realizations
# Rules whose paper reference P (Sec. 4, Table 6) is not a distribution: realization="normalized" (default)
# induces P / sum(P) exactly; realization="residual" is the h = min(1, P/q), r = norm([P - q]+) construction.

UNNORMALIZED = [
    ("adaptive-interpolation", {"lam": 0.4}),
    ("overshoot-ceiling", {"lam": 0.4}),
    ("ceiling", {"l": 0.4}),
    ("minp-cap", {"p_base": 0.5, "l": 0.4}),
]


@PROPS
@given(pairs())
def test_normalized_realization_induces_p_over_sum_p(pq):
    p, q = pq
    for name, params in UNNORMALIZED:
        rule = rules.get(name, **params)
        assert rule.realization == "normalized"
        ref = rule.reference(p, q)
        expected = ref / ref.sum() if float(ref.sum()) > 0 else p  # disjoint supports: Ptilde = p (documented)
        assert maxdiff(induced_distribution(rule, p, q), expected) < TOL, name


def test_paper_references_are_not_normalized():
    """The reason for the realization parameter: sum(P) != 1 on the worked pair for every such rule."""
    for name, params in UNNORMALIZED:
        rule = rules.get(name, **params)
        assert abs(float(rule.reference(d(P5), d(Q5)).sum()) - 1) > 1e-3, name


@PROPS
@given(pairs(), st.sampled_from([0.2, 0.4, 0.6, 0.8, 1.0]))
def test_adaptive_interpolation_residual_is_cos_we(pq, lam):
    """Issue 15: realized as h = min(1, P/q), r = norm([P - q]+), adaptive interpolation induces CoS-WE(lam)."""
    p, q = pq
    res = induced_distribution(rules.get("adaptive-interpolation", lam=lam, realization="residual"), p, q)
    assert maxdiff(res, cos_we_closed_form(p, q, lam)) < TOL


def test_adaptive_interpolation_normalized_differs_from_cos_we():
    for lam in (0.2, 0.4, 0.6, 0.8):
        out = induced_distribution(rules.get("adaptive-interpolation", lam=lam), P5, Q5)
        assert float(tv(out, cos_we_closed_form(P5, Q5, lam))) > 1e-3, lam
        # and it is the paper's shape: q + Delta (p - q) on q <= p, lam p + (1 - lam) q above, renormalized
        delta = lenience_delta(d(P5), d(Q5), lam)
        shape = torch.where(d(Q5) <= d(P5), d(Q5) + delta * (d(P5) - d(Q5)), lam * d(P5) + (1 - lam) * d(Q5))
        assert maxdiff(out, shape / shape.sum()) < TOL


@PROPS
@given(pairs(), st.sampled_from([0.2, 0.5, 0.8]))
def test_overshoot_ceiling_residual_is_an_adaptive_coefficient(pq, lam):
    """Residual realization on q <= p: q + (R / TV)(p - q), R the rejected mass, TV = TV(p, q)."""
    p, q = pq
    rule = rules.get("overshoot-ceiling", lam=lam, realization="residual")
    out = induced_distribution(rule, p, q)
    rej = 1 - float(acceptance_probability(rule, p, q))
    t = float(tv(p, q))
    if t > 1e-9:
        low = q <= p
        expected = q + rej / t * (p - q)
        assert maxdiff(out[low], expected[low]) < 1e-10


@PROPS
@given(pairs(), st.sampled_from([0.1, 0.3, 0.5, 0.9, 1.0]))
def test_ceiling_residual_is_lenience(pq, l):
    p, q = pq
    out = induced_distribution(rules.get("ceiling", l=l, realization="residual"), p, q)
    assert maxdiff(out, induced_distribution(rules.get("lenience", l=l), p, q)) < TOL


def test_ceiling_normalized_differs_from_lenience():
    out = induced_distribution(rules.get("ceiling", l=0.4), P5, Q5)
    ref = torch.minimum(d(Q5), d(P5) / 0.4)
    assert maxdiff(out, ref / ref.sum()) < TOL
    assert float(tv(out, induced_distribution(rules.get("lenience", l=0.4), P5, Q5))) > 1e-2


@PROPS
@given(pairs(), st.sampled_from([0.3, 0.7]), st.sampled_from([0.2, 0.6]))
def test_minp_cap_residual_equals_the_pre_realization_construction(pq, p_base, l):
    """realization="residual" is exactly the old rule: h = 1 on A, min(1, p/(l q)) outside, r = norm([p - q]+)."""
    p, q = pq
    rule = rules.get("minp-cap", p_base=p_base, l=l, realization="residual")
    inside = minp_mask(p, p_base)
    h = torch.where(q > 0, torch.where(inside, torch.ones_like(p), torch.clamp(p / (l * torch.where(q > 0, q, 1)),
                                                                                max=1.0)), torch.zeros_like(p))
    assert maxdiff(rule.acceptance(p, q), h) < TOL
    res = torch.clamp(p - q, min=0)
    if float(res.sum()) > 0:
        assert maxdiff(rule.correction(p, q), res / res.sum()) < TOL


def test_realization_is_validated():
    with pytest.raises(ValueError, match="realization"):
        rules.get("ceiling", realization="both")
    with pytest.raises(ValueError, match="no parameter"):
        rules.get("cos-we", realization="residual")


# ----------------------------------------------------------------------------------------------- baselines' draft


def test_baselines_leave_the_draft_untouched_by_default():
    q = d(Q5)
    for name, params in (("minp-sampling", {"p_base": 0.5}), ("eta-sampling", {"epsilon": 1.0})):
        rule = rules.get(name, **params)
        assert rule.draft_truncation == "none"
        assert torch.equal(rule.draft(q), q)  # App. C / Lemma 1: the baseline reuses the untruncated draft
        same = rules.get(name, draft_truncation="same", **params)
        assert maxdiff(same.draft(q), renormalize_on(q, same.allowed(q))) < TOL
        assert float(tv(same.draft(q), q)) > 1e-3
        # lossless w.r.t. p_Theta either way; only the acceptance differs
        for r in (rule, same):
            assert maxdiff(induced_distribution(r, P5, r.draft(q)), r.target(d(P5))) < TOL
        assert abs(float(acceptance_probability(rule, P5, rule.draft(q)))
                   - float(acceptance_probability(same, P5, same.draft(q)))) > 1e-3
    assert rules.matched_baseline(rules.get("spec-cascade", p_base=0.3), "same").draft_truncation == "same"
    with pytest.raises(ValueError, match="draft_truncation"):
        rules.get("minp-sampling", draft_truncation="q")


# ----------------------------------------------------------------------------------------------- typical, Eq. 28


def test_typical_ratio_reading_on_chains():
    """acceptance="ratio": h = min{p / tau, 1}, tau = min(eps, delta e^-H(p)); 1 on A_eta, fractional below."""
    from verispec.core.sampling import eta_threshold

    p, q = d(P5), d(Q5)
    ind = rules.get("typical", epsilon=0.3)
    rat = rules.get("typical", epsilon=0.3, acceptance="ratio")
    tau = eta_threshold(p, 0.3)
    assert maxdiff(rat.acceptance(p, q), torch.clamp(p / tau, max=1.0)) < TOL
    allowed = eta_mask(p, 0.3)
    assert maxdiff(rat.acceptance(p, q)[allowed], torch.ones(int(allowed.sum()), dtype=torch.float64)) < TOL
    assert maxdiff(ind.acceptance(p, q), allowed.to(torch.float64)) < TOL
    assert float(tv(induced_distribution(rat, p, q), induced_distribution(ind, p, q))) > 1e-3
    with pytest.raises(ValueError, match="acceptance"):
        rules.get("typical", acceptance="sometimes")
