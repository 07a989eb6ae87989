"""The exact analysis and the rules' parameters (exact arithmetic, float64, no sampling): chain verifiers verify a
lossless rule's own target, closed forms refuse what the rules refuse, and the published parameter ranges are the
enforced ones."""

from __future__ import annotations

import pytest
import torch

from verispec import rules
from verispec.analysis import allowed_set, cos_we_closed_form, lenience_closed_form, truncation_closed_form
from verispec.analysis.sequence import round_law, sequence_distribution

TOL = 1e-12
P = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)
Q = torch.tensor([0.2, 0.35, 0.05, 0.3, 0.1], dtype=torch.float64)


def _toy(vocab: int, seed: int):
    """Context-dependent p(prefix), q(prefix) with exact zeros (a deterministic function of the prefix)."""

    def dist(prefix: tuple[int, ...], salt: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, salt) + prefix) % (2**31))
        w = torch.rand(vocab, generator=g, dtype=torch.float64) ** 3
        w[torch.rand(vocab, generator=g) < 0.25] = 0.0
        w[int(torch.randint(vocab, (1,), generator=g))] += 0.05  # never all zero
        return w / w.sum()

    return (lambda s: dist(s, 0)), (lambda s: dist(s, 1))


def _first_token(law: dict[tuple[int, ...], float], vocab: int) -> torch.Tensor:
    out = torch.zeros(vocab, dtype=torch.float64)
    for key, pr in law.items():
        out[key[0]] += pr
    return out


@pytest.mark.parametrize("verifier", ["block", "hsd"])
@pytest.mark.parametrize(
    "rule",
    [
        rules.get("minp-sampling", p_base=0.4),
        rules.get("minp-sampling", p_base=0.3, draft_truncation="same"),
        rules.get("eta-sampling", epsilon=0.2),
    ],
    ids=lambda r: r.describe(),
)
def test_chain_verifiers_emit_the_truncated_target(rule, verifier):
    """Block and HSD verification of a truncation baseline verify p_Theta (the rule's target) against the rule's
    draft: one round's first token is p_Theta, and whole continuations have the token-wise verifier's law (both
    are p_Theta at every position). Before the fix the chain verifiers' law used the untruncated p (first token
    exactly p = (0.5, 0.25, 0.15, 0.07, 0.03), tokens outside A_Theta included)."""
    law = round_law(rule, lambda s: P, lambda s: Q, 2, (), verifier)
    assert float((_first_token(law, 5) - rule.target(P)).abs().max()) < TOL
    p_fn, q_fn = _toy(4, 3)
    token = sequence_distribution(rule, p_fn, q_fn, gamma=2, length=3)
    chain = sequence_distribution(rule, p_fn, q_fn, gamma=2, length=3, verifier=verifier)
    keys = set(token) | set(chain)
    assert max(abs(token.get(k, 0.0) - chain.get(k, 0.0)) for k in keys) < TOL
    # and that law is the target's: p_Theta at every position, by the chain rule
    for key, pr in chain.items():
        expect = 1.0
        for i, x in enumerate(key):
            expect *= float(rule.target(p_fn(key[:i]))[x])
        assert abs(pr - expect) < TOL


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: lenience_closed_form(P, Q, 0), "l"),  # was ZeroDivisionError
        (lambda: lenience_closed_form(P, Q, 2.0), "l"),  # was a "distribution" with Delta 1.7
        (lambda: lenience_closed_form(P, Q, float("nan")), "l"),
        (lambda: cos_we_closed_form(P, Q, 2.0), "lam"),  # was negative entries
        (lambda: cos_we_closed_form(P, Q, -0.5), "lam"),
        (lambda: lenience_closed_form([0.5, 0.6], [1.0, 0.0], 0.5), "p"),  # Eq. 25 needs sum p = 1
        (lambda: cos_we_closed_form([0.5, 0.5], [0.7, 0.7], 0.5), "q"),
        (lambda: truncation_closed_form([0.5, 0.6], torch.tensor([True, True])), "q"),
        (lambda: allowed_set(P, "minp", 1.5), "p_base"),  # was the empty set (p_Theta undefined)
        (lambda: allowed_set(P, "minp", 0.0), "p_base"),
        (lambda: allowed_set(P, "eta", 0.0), "epsilon"),
        (lambda: allowed_set(P, "eta", 0.1, delta=-1.0), "delta"),
    ],
)
def test_closed_forms_refuse_what_the_rules_refuse(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


def test_closed_forms_in_range_are_unchanged():
    law, delta = lenience_closed_form(P, Q, 0.4)
    assert abs(float(law.sum()) - 1) < TOL and 0 <= float(delta) <= 1
    assert float((cos_we_closed_form(P, Q, 0.3) - (0.3 * P + 0.7 * Q)).abs().max()) < TOL
    assert allowed_set(P, "minp", 1.0).tolist() == [True, False, False, False, False]


def test_get_refuses_parameters_given_with_a_rule_object():
    """They used to be dropped silently: get(lenience(l=0.5), l=2.0) returned lenience(l=0.5)."""
    rule = rules.get("lenience", l=0.5)
    assert rules.get(rule) is rule
    with pytest.raises(ValueError, match=r"\bl\b"):
        rules.get(rule, l=2.0)
    with pytest.raises(ValueError, match=r"\bl\b"):
        rules.get(rule, l=0.1)


@pytest.mark.parametrize("name", ["overshoot-ceiling", "adaptive-interpolation"])
def test_section4_ablations_publish_the_lam_range_they_enforce(name):
    """lam = 0 is refused (the ceiling p / lam, Delta with l = lam); describe() used to publish lam in [0, 1]."""
    schema = rules.describe()[name]["params"]["lam"]
    assert schema.get("exclusiveMinimum") == 0.0 and "minimum" not in schema
    with pytest.raises(ValueError, match=r"^lam .*\(0, 1\]"):
        rules.get(name, lam=0.0)
    rules.get(name, lam=1e-9)
    assert rules.describe()["cos-we"]["params"]["lam"]["minimum"] == 0.0  # Eq. 2 allows lam = 0
