"""Exact distribution of whole continuations produced by the speculative loop (composition over positions).

Within a round the emitted token at draft index k < gamma follows the rule's one-step law, split into the
accept path q h (the round goes on to index k + 1) and the reject path (sum q (1 - h)) r (a new round
starts); index gamma emits the bonus. This module composes that exactly over a short horizon for any
p(prefix), q(prefix) callables, mirroring the engine's gamma capping (gamma_round = min(gamma, remaining - 1)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verispec.core.rules import Rule, get

__all__ = ["sequence_distribution"]

DistFn = Callable[[tuple[int, ...]], torch.Tensor]


def sequence_distribution(
    rule: Rule | str,
    p_fn: DistFn,
    q_fn: DistFn | None,
    gamma: int,
    length: int,
    prompt: tuple[int, ...] = (),
) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of ``length`` tokens after ``prompt``.

    ``p_fn(prefix)`` / ``q_fn(prefix)`` return the processed target / draft distributions (float64, [V]) for
    the next token after ``prefix`` (the full sequence so far). ``q_fn=None`` means the target alone (gamma 0).
    """
    rule = get(rule) if isinstance(rule, str) else rule
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float, k: int, g: int) -> None:
        done = len(prefix) - len(prompt)
        if prob == 0.0:
            return
        if done == length:
            key = prefix[len(prompt) :]
            out[key] = out.get(key, 0.0) + prob
            return
        if k == 0:  # a new round starts: the engine caps gamma by the tokens still allowed
            g = 0 if q_fn is None else max(min(gamma, length - done - 1), 0)
        p = p_fn(prefix).to(torch.float64)
        if k == g:  # bonus (or a target-only step)
            bonus = rule.bonus(p)
            for x in torch.nonzero(bonus > 0).flatten().tolist():
                walk(prefix + (x,), prob * float(bonus[x]), 0, 0)
            return
        q = q_fn(prefix).to(torch.float64)  # type: ignore[misc]
        q = rule.draft(q)
        h = rule.acceptance(p, q)
        r = rule.correction(p, q)
        accept = q * h
        reject = float((q * (1 - h)).sum())
        for x in torch.nonzero(accept > 0).flatten().tolist():
            walk(prefix + (x,), prob * float(accept[x]), k + 1, g)
        if reject > 0:
            for x in torch.nonzero(r > 0).flatten().tolist():
                walk(prefix + (x,), prob * reject * float(r[x]), 0, 0)

    walk(tuple(prompt), 1.0, 0, 0)
    return out
