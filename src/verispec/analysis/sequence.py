"""Exact distribution of whole continuations produced by the speculative loop (composition over rounds).

A round from a prefix drafts g = min(gamma, remaining - 1) tokens (the engine's capping) and emits the accepted
drafts plus one correction or bonus token. :func:`round_law` gives the exact law of what one round emits, for
token-wise verification (at draft index k < g the emitted token follows the rule's one-step law, split into the
accept path q h, which goes on to index k + 1, and the reject path (sum q (1 - h)) r; index g emits the bonus) and
for block verification (every draft path x_1 .. x_g weighed by prod q, the kept prefix tau with probability
h_tau prod_{j > tau} (1 - h_j), then the bonus or the block residual: :mod:`verispec.core.verify.block`).
:func:`sequence_distribution` composes rounds exactly over a short horizon for any p(prefix), q(prefix)
callables; :func:`expected_accepted` is the exact expected number of accepted drafts in one round.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verispec.core.rules import Rule, get
from verispec.core.rules.budget import Budget, budgeted, choose, family_of
from verispec.core.verify.block import block_acceptance, block_residual, block_weights
from verispec.core.verify.hsd import hsd_ratios, hsd_residual, hsd_stop
from verispec.defaults import VERIFIERS, check_verifier

__all__ = ["VERIFIERS", "DraftLengthFn", "engine_draft_length", "expected_accepted", "round_law",
           "sequence_distribution"]

DistFn = Callable[[tuple[int, ...]], torch.Tensor]
#: (tokens emitted so far, token limit, gamma) -> drafts in the next round
DraftLengthFn = Callable[[int, int, int], int]


def engine_draft_length(done: int, length: int, gamma: int) -> int:
    """verispec's engine: gamma drafts, capped so that the round's bonus is the last token allowed."""
    return max(min(gamma, length - done - 1), 0)


def _token_round(rule: Rule, p_fn: DistFn, q_fn: DistFn, g: int,
                 prefix: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}

    def rec(path: tuple[int, ...], prob: float, k: int) -> None:
        if prob == 0.0:
            return
        pre = prefix + path
        p = p_fn(pre).to(torch.float64)
        if k == g:  # bonus (or a target-only step)
            bonus = rule.bonus(p)
            for x in torch.nonzero(bonus > 0).flatten().tolist():
                out[path + (x,)] = out.get(path + (x,), 0.0) + prob * float(bonus[x])
            return
        q = rule.draft(q_fn(pre).to(torch.float64))
        h = rule.acceptance(p, q)
        r = rule.correction(p, q)
        accept = q * h
        reject = float((q * (1 - h)).sum())
        for x in torch.nonzero(accept > 0).flatten().tolist():
            rec(path + (x,), prob * float(accept[x]), k + 1)
        if reject > 0:
            for x in torch.nonzero(r > 0).flatten().tolist():
                out[path + (x,)] = out.get(path + (x,), 0.0) + prob * reject * float(r[x])

    rec((), 1.0, 0)
    return out


def _budget_round(rule: Rule, budget: Budget, p_fn: DistFn, q_fn: DistFn, g: int, prefix: tuple[int, ...],
                  spent: float, left: int) -> dict[tuple[int, ...], tuple[float, float]]:
    """One round under a divergence budget, as the engine runs it: at draft index k the rule's family with the
    parameter that accepts most within ``budget.allowance(spent, left - k)`` of p. Values: (probability, spent after
    the round); the spent budget is a function of the emitted tokens (each emitted position adds its TV)."""
    family_of(rule)  # a rule without a family (or the wrong realization) is refused here
    out: dict[tuple[int, ...], tuple[float, float]] = {}

    def add(key: tuple[int, ...], pr: float, sp: float) -> None:
        old = out.get(key, (0.0, sp))
        out[key] = (old[0] + pr, sp)

    def rec(path: tuple[int, ...], prob: float, k: int, sp: float) -> None:
        if prob == 0.0:
            return
        pre = prefix + path
        p = p_fn(pre).to(torch.float64)
        if k == g:  # bonus (or a target-only step): lossless, distance 0
            for x in torch.nonzero(p > 0).flatten().tolist():
                add(path + (x,), prob * float(p[x]), sp)
            return
        q = q_fn(pre).to(torch.float64)
        theta, tv = choose(rule, p, q, budget.allowance(sp, left - k))
        at = budgeted(rule, theta)
        h, r = at.acceptance(p, q), at.correction(p, q)
        accept, reject = q * h, float((q * (1 - h)).sum())
        sp = sp + float(tv)
        for x in torch.nonzero(accept > 0).flatten().tolist():
            rec(path + (x,), prob * float(accept[x]), k + 1, sp)
        if reject > 0:
            for x in torch.nonzero(r > 0).flatten().tolist():
                add(path + (x,), prob * reject * float(r[x]), sp)

    rec((), 1.0, 0, spent)
    return out


def _draft_paths(rule: Rule, p_fn: DistFn, q_fn: DistFn, g: int, prefix: tuple[int, ...]):
    """Every draft path x_1 .. x_g of positive probability under q, depth first over q's support (not all V^g
    paths: a real vocabulary with top-k has few), with its probability, its q_1 .. q_g and p_1 .. p_{g+1}.

    A chain verifier verifies the lossless rule's own law: p_i is ``rule.target(p)`` (p_Theta for the truncation
    baselines, whose token-wise form verifies p_Theta too) and q_i is ``rule.draft(q)``, what the draft samples."""

    def rec(path: tuple[int, ...], prob: float, qs: list, ps: list):
        pre = prefix + path
        p = rule.target(p_fn(pre).to(torch.float64))
        if len(path) == g:
            yield path, prob, qs, ps + [p]
            return
        q = rule.draft(q_fn(pre).to(torch.float64))
        for x in torch.nonzero(q > 0).flatten().tolist():
            yield from rec(path + (x,), prob * float(q[x]), qs + [q], ps + [p])

    yield from rec((), 1.0, [], [])


def _block_round(rule: Rule, p_fn: DistFn, q_fn: DistFn, g: int, prefix: tuple[int, ...]
                 ) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for path, prob, qs, ps in _draft_paths(rule, p_fn, q_fn, g, prefix):
        p, q = torch.stack(ps).unsqueeze(0), torch.stack(qs).unsqueeze(0)
        x = torch.tensor([path], dtype=torch.long)
        w = block_weights(x, q, p)
        h = block_acceptance(w, q, p)[0].tolist()
        for tau in range(g + 1):
            pt = h[tau - 1] if tau else 1.0  # P(tau | path) = h_tau prod_{j > tau} (1 - h_j)
            for hj in h[tau:]:
                pt *= 1.0 - hj
            if pt <= 0.0:
                continue
            if tau == g:
                final = p[0, g]
            else:
                final = block_residual(w[:, tau], p[:, tau], q[:, tau])[0]
            for y in torch.nonzero(final > 0).flatten().tolist():
                key = path[:tau] + (y,)
                out[key] = out.get(key, 0.0) + prob * pt * float(final[y])
    return out


def _hsd_round(rule: Rule, p_fn: DistFn, q_fn: DistFn, g: int, prefix: tuple[int, ...]
               ) -> dict[tuple[int, ...], float]:
    """Every draft path weighed by prod q; the whole block kept with probability rho_g, else the walk down the
    depths (:mod:`verispec.core.verify.hsd`), with the sampler's own functions."""
    out: dict[tuple[int, ...], float] = {}
    for path, prob, qs, ps in _draft_paths(rule, p_fn, q_fn, g, prefix):
        p, q = torch.stack(ps).unsqueeze(0), torch.stack(qs).unsqueeze(0)
        rho = hsd_ratios(torch.tensor([path], dtype=torch.long), q, p)
        stop = hsd_stop(rho, q, p)[0].tolist()
        whole = float(rho[0, g])
        for y in torch.nonzero(p[0, g] > 0).flatten().tolist():
            out[path + (y,)] = out.get(path + (y,), 0.0) + prob * whole * float(p[0, g, y])
        left = prob * (1.0 - whole)
        for i in range(g, 0, -1):  # depth i keeps path[: i - 1] and redraws token i
            if left <= 0.0:
                break
            here = left * stop[i - 1]
            if here > 0.0:
                r = hsd_residual(rho[:, i - 1], p[:, i - 1], q[:, i - 1])[0]
                for y in torch.nonzero(r > 0).flatten().tolist():
                    key = path[: i - 1] + (y,)
                    out[key] = out.get(key, 0.0) + here * float(r[y])
            left -= here
    return out


def round_law(rule: Rule | str, p_fn: DistFn, q_fn: DistFn | None, g: int, prefix: tuple[int, ...] = (),
              verifier: str = "token") -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one round emits after ``prefix`` with ``g`` drafts (accepted drafts + one
    correction or bonus token); ``q_fn=None`` or ``g = 0``: one target step. Block and HSD verification need a
    lossless rule and verify its target (``rule.target(p)``: p, or p_Theta for the truncation baselines) against
    ``rule.draft(q)``."""
    rule = get(rule) if isinstance(rule, str) else rule
    check_verifier(verifier, rule.lossless, trees=False)
    if q_fn is None:
        g = 0
    if verifier == "block" and g > 0:
        return _block_round(rule, p_fn, q_fn, g, prefix)  # type: ignore[arg-type]
    if verifier == "hsd" and g > 0:
        return _hsd_round(rule, p_fn, q_fn, g, prefix)  # type: ignore[arg-type]
    return _token_round(rule, p_fn, q_fn, g, prefix)  # type: ignore[arg-type]


def expected_accepted(rule: Rule | str, p_fn: DistFn, q_fn: DistFn, gamma: int, prefix: tuple[int, ...] = (),
                      verifier: str = "token") -> float:
    """Exact expected number of drafts accepted in one round of ``gamma`` drafts after ``prefix``."""
    return sum((len(k) - 1) * v for k, v in round_law(rule, p_fn, q_fn, gamma, prefix, verifier).items())


def sequence_distribution(
    rule: Rule | str,
    p_fn: DistFn,
    q_fn: DistFn | None,
    gamma: int,
    length: int,
    prompt: tuple[int, ...] = (),
    verifier: str = "token",
    budget: Budget | None = None,
    draft_length: DraftLengthFn | None = None,
) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of ``length`` tokens after ``prompt``.

    ``p_fn(prefix)`` / ``q_fn(prefix)`` return the processed target / draft distributions (float64, [V]) for
    the next token after ``prefix`` (the full sequence so far). ``q_fn=None`` means the target alone (gamma 0).
    ``verifier``: "token" (the rule, token by token), "block" (:mod:`verispec.core.verify.block`) or "hsd"
    (:mod:`verispec.core.verify.hsd`).
    ``budget``: a divergence budget on the rule's family (:mod:`verispec.core.rules.budget`), with ``length`` as
    the request's max_new_tokens, exactly as the engine spends it.
    ``draft_length(done, length, gamma)``: the number of drafts of the round that starts after ``done`` emitted tokens;
    default :func:`engine_draft_length` (verispec's engine caps gamma so that a round never overshoots). An engine
    that drafts past the token limit and cuts its output there (vLLM) has a law of its own for lossy rules: a round
    then emits up to g + 1 tokens and the tokens past ``length`` are dropped.
    """
    rule = get(rule) if isinstance(rule, str) else rule
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float, spent: float) -> None:
        done = len(prefix) - len(prompt)
        if prob == 0.0:
            return
        if done == length:
            key = prefix[len(prompt) :]
            out[key] = out.get(key, 0.0) + prob
            return
        g = 0 if q_fn is None else (draft_length or engine_draft_length)(done, length, gamma)
        if budget is not None and g > 0:
            if draft_length is not None:
                raise ValueError("a divergence budget is spent as verispec's engine drafts (draft_length=None)")
            law = _budget_round(rule, budget, p_fn, q_fn, g, prefix, spent, length - done)  # type: ignore[arg-type]
            for emitted, (pr, sp) in law.items():
                walk(prefix + emitted, prob * pr, sp)
            return
        for emitted, pr in round_law(rule, p_fn, q_fn, g, prefix, verifier).items():
            walk(prefix + emitted[: length - done], prob * pr, spent)  # an overshooting round is cut

    walk(tuple(prompt), 1.0, 0.0)
    return out
