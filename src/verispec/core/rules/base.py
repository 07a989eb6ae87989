"""The shape of a verification rule: acceptance probability h + correction distribution r.

A rule is data. :func:`verispec.core.verify.chain.verify_block` samples any rule, and
:func:`verispec.analysis.induced_distribution` computes exactly what any rule induces, both from the same
two functions; the tree walk (:mod:`verispec.core.verify.tree`) and its exact analysis share one step built from
them too.
All tensors are batched over leading dimensions with the vocabulary last; p and q are normalized probabilities
(float64 recommended).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

__all__ = [
    "REALIZATIONS",
    "ReferenceRule",
    "Rule",
    "UnnormalizedReferenceRule",
    "positive_residual",
    "ratio_acceptance",
]

Realization = Literal["normalized", "residual"]
REALIZATIONS: tuple[str, ...] = ("normalized", "residual")
TreeRejection = Literal["residual", "keep"]


def ratio_acceptance(ref: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """h = min(1, ref / q), with h = 0 where q = 0: a token its draft gives no mass cannot have been drafted from
    it, so it is rejected (vLLM's rejection sampler does the same). The value there never enters an induced
    distribution (it is multiplied by q = 0); :func:`verispec.core.verify.chain.verify_block` also enforces it for every
    rule."""
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, torch.clamp(ref / safe_q, max=1.0), torch.zeros_like(q))


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
    #: this rule's own ranges where they are narrower than :data:`verispec.core.rules.validate.RANGES` (its checks
    #: and :func:`verispec.core.rules.describe` both read them): name -> (low, high, low open, high open)
    param_ranges: ClassVar[dict[str, tuple[float, float, bool, bool]]] = {}
    #: how a tree position goes on after a rejected candidate (App. H.1), read from :meth:`tree_verifier`:
    #: "residual": the next candidate is verified against the correction r and the bonus drawn from the last r
    #: (recursive rejection sampling; Lemma 3(i)); "keep": every candidate is verified against the same target
    #: and the bonus drawn from it (Lemma 3(ii)); None: the rule has no tree walk.
    tree_rejection: ClassVar[TreeRejection | None] = None

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

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The exact law emitted at one drafted position: accept path q h + reject path (sum q (1 - h)) r
        (tutorial section 4; App. A of the lossy-verification paper)."""
        h = self.acceptance(p, q)
        reject = (q * (1 - h)).sum(-1, keepdim=True)
        return q * h + reject * self.correction(p, q)

    def greedy_reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The distribution whose argmax deterministic (temperature-0) verification emits, from the UNtempered
        p and q (:func:`verispec.core.verify.chain.verify_greedy_rule`): the draft is accepted iff it is this argmax.

        Default: what the rule induces at one position (:meth:`induced`), so greedy mode emits the mode of the
        rule's own law: p (p_Theta) for lossless rules, Eq. 8's mixture for CoS-WE, Eq. 10 for lenience,
        P / sum(P) for the normalized reference rules, Eq. 13 (q / Z(q) on A) for truncation-based rules.
        """
        if self.lossless:
            return self.target(p)
        return self.induced(p, q)

    def at(self, rows: torch.Tensor, index: torch.Tensor) -> Rule:
        """The rule at position ``index[i]`` of row ``rows[i]`` of a block: itself, except for a rule whose
        parameters differ per position (:class:`verispec.core.rules.budget.PerPosition`). The chain sampler
        asks for it where it draws the correction of each row's stopping position."""
        return self

    def tree_verifier(self) -> Rule:
        """The rule the tree walk applies to p~ = ``self.target(p)`` at each position (App. H.1: "with a
        truncation warper active the verifier scores candidates by the truncated target p_Theta"). The rule
        itself by default; the truncation baselines return plain lossless SD (p_Theta verified losslessly)."""
        return self

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


@dataclass(frozen=True)
class UnnormalizedReferenceRule(ReferenceRule):
    """A rule whose paper reference P (Sec. 4, Table 6) is not a distribution: sum(P) != 1 in general. How it is
    realized as (h, r) is an explicit choice, the ``realization`` parameter:

    * ``"normalized"`` (default): Ptilde = P / sum(P); h = min(1, Ptilde / q), r = norm([Ptilde - q]+). The
      rule induces exactly Ptilde (tutorial section 4), i.e. the paper's shape, every region of P included.
      Where sum(P) = 0 (only when the supports of p and q are disjoint) Ptilde is taken to be p.
    * ``"residual"``: h = min(1, P / q), r = norm([P - q]+) with the fallbacks of :func:`positive_residual`
      ([p - q]+, then p). What this induces is in general NOT P / sum(P): the rejected mass is spread by the
      residual, not by P (e.g. adaptive-interpolation becomes CoS-WE, see docs/paper_notes.md).

    :meth:`reference` returns the paper's P as printed (unnormalized); :meth:`normalized_reference` Ptilde.
    """

    realization: Realization = field(default="normalized", kw_only=True)

    def _check_realization(self) -> None:
        if self.realization not in REALIZATIONS:
            raise ValueError(f"realization must be 'normalized' or 'residual', got {self.realization!r}")

    def normalized_reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Ptilde = P / sum(P) (p where sum(P) = 0)."""
        ref = self.reference(p, q)
        mass = ref.sum(-1, keepdim=True)
        return torch.where(mass > 0, ref / torch.where(mass > 0, mass, torch.ones_like(mass)), p)

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.realization == "residual":
            return super().acceptance(p, q)
        return ratio_acceptance(self.normalized_reference(p, q), q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.realization == "residual":
            return super().correction(p, q)
        ref = self.normalized_reference(p, q)
        return positive_residual(torch.clamp(ref - q, min=0), torch.clamp(p - q, min=0), p)
