"""The shape of a verification rule: acceptance probability h + correction distribution r.

A rule is data. :func:`verispec.verify.verify_block` samples any rule, and
:func:`verispec.analysis.induced_distribution` computes exactly what any rule induces, both from the same
two functions. All tensors are batched over leading dimensions with the vocabulary last; p and q are
normalized probabilities (float64 recommended).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = ["ReferenceRule", "Rule", "positive_residual", "ratio_acceptance"]


def ratio_acceptance(ref: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """h = min(1, ref / q), with h = 1 where q = 0 (such tokens are never drafted, so h there is moot)."""
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, torch.clamp(ref / safe_q, max=1.0), torch.ones_like(q))


def positive_residual(*candidates: torch.Tensor) -> torch.Tensor:
    """Normalize the first candidate with positive mass, row by row.

    Used as ``positive_residual([P - q]+, [p - q]+, p)``: the standard residual, with documented fallbacks for
    rows where it has no mass. On such rows the accept path has probability one for the lossless rule, so the
    fallback is never sampled; for lossy rules whose reference residual vanishes while rejection is still
    possible the fallback is what they induce (reported exactly by the analysis).
    """
    out = candidates[-1] / candidates[-1].sum(-1, keepdim=True)
    for cand in reversed(candidates[:-1]):
        mass = cand.sum(-1, keepdim=True)
        out = torch.where(mass > 0, cand / torch.where(mass > 0, mass, torch.ones_like(mass)), out)
    return out


@dataclass(frozen=True)
class Rule:
    """Base class of verification rules.

    Subclasses set ``name``, ``equation`` (where the rule comes from), ``lossless`` (True when the induced
    distribution equals :meth:`target`), and implement :meth:`acceptance` and :meth:`correction`.
    """

    name: ClassVar[str] = ""
    equation: ClassVar[str] = ""
    lossless: ClassVar[bool] = False
    #: names of the constructor parameters, in the order they are documented
    param_names: ClassVar[tuple[str, ...]] = ()

    def target(self, p: torch.Tensor) -> torch.Tensor:
        """The distribution the rule is measured against (p; the truncated p_Theta for the baselines)."""
        return p

    def draft(self, q: torch.Tensor) -> torch.Tensor:
        """The transformation the draft's sampling distribution gets under this rule (identity by default)."""
        return q

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """h(x; p, q) for every x of the vocabulary, in [0, 1]."""
        raise NotImplementedError

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """r(.; p, q): the normalized distribution a rejected position is resampled from."""
        raise NotImplementedError

    def bonus(self, p: torch.Tensor) -> torch.Tensor:
        """Distribution of the bonus token drawn after a fully accepted block (p, or p_Theta)."""
        return self.target(p)

    @property
    def params(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.param_names}

    def describe(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)}" for k in self.param_names)
        return f"{self.name}({args})"


@dataclass(frozen=True)
class ReferenceRule(Rule):
    """A rule given by a reference P(x; p, q): h = min(1, P/q), r proportional to [P - q]+.

    For a normalized P this induces P exactly (tutorial section 4); for an unnormalized P it does not, and
    :func:`verispec.analysis.induced_distribution` reports what it really induces. When [P - q]+ has no
    mass on a row the correction falls back to [p - q]+, then to p (see :func:`positive_residual`).
    """

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return ratio_acceptance(self.reference(p, q), q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        ref = self.reference(p, q)
        return positive_residual(torch.clamp(ref - q, min=0), torch.clamp(p - q, min=0), p)
