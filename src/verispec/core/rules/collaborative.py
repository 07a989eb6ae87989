"""Collaborative verification (section 3.1 and 4 of the lossy-verification paper): the output distribution
interpolates between the draft q and the target p. All of these are lossy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from verispec.core.rules.base import ReferenceRule, Rule, UnnormalizedReferenceRule, positive_residual, ratio_acceptance
from verispec.core.rules.validate import check_l, check_lam, check_p_base, check_range
from verispec.core.sampling import minp_mask

#: lam of the Section 4 ablations: the ceiling p / lam and Delta (Eq. 11 with l = lam) divide by it, so 0 is out
_POSITIVE_LAM = {"lam": (0.0, 1.0, True, False)}

__all__ = [
    "AdaptiveInterpolation",
    "Ceiling",
    "CosCD",
    "CosWE",
    "Lenience",
    "MinPCap",
    "OvershootCeiling",
    "lenience_delta",
]


def lenience_delta(p: torch.Tensor, q: torch.Tensor, l: float) -> torch.Tensor:
    """Delta of Eq. 11 / Eq. 15: sum(q - min(q, p/l)) / sum(q - min(q, p)), with keepdim.

    Where p = q the denominator is 0; Delta is then irrelevant (it multiplies [p - q]+ = 0) and set to 0.
    """
    num = (q - torch.minimum(q, p / l)).sum(-1, keepdim=True)
    den = (q - torch.minimum(q, p)).sum(-1, keepdim=True)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))


@dataclass(frozen=True)
class Lenience(Rule):
    """Lenience relaxation (Leviathan et al.): h = min(1, p / (l q)) (Eq. 9), residual norm([p - q]+)
    (Appendix A). Induces min(q, p/l) + Delta [p - q]+ (Eq. 10-11)."""

    l: float = 0.5
    name: ClassVar[str] = "lenience"
    equation: ClassVar[str] = "Eq. 9-11, App. A"
    param_names: ClassVar[tuple[str, ...]] = ("l",)

    def __post_init__(self) -> None:
        check_l(self.l)

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return ratio_acceptance(p / self.l, q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return positive_residual(torch.clamp(p - q, min=0), p)


@dataclass(frozen=True)
class CosWE(ReferenceRule):
    """CoS, weighted-ensemble variant: reference pi = lam p + (1 - lam) q (Eq. 2), h = min(1, pi/q) (Eq. 7),
    r = norm([pi - q]+) = norm([p - q]+). Induces the mixture pi exactly (Eq. 8)."""

    lam: float = 0.5
    name: ClassVar[str] = "cos-we"
    equation: ClassVar[str] = "Eq. 2, 7, 8"
    param_names: ClassVar[tuple[str, ...]] = ("lam",)

    def __post_init__(self) -> None:
        check_lam(self.lam)

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self.lam * p + (1 - self.lam) * q

    def greedy_reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Eq. 2 itself, lam p + (1 - lam) q (the weighted ensemble whose argmax greedy verification emits)."""
        return self.reference(p, q)


@dataclass(frozen=True)
class CosCD(ReferenceRule):
    """CoS, contrastive variant: reference pi proportional to p / q^lam (Eq. 3), h = min(1, pi/q),
    r = norm([pi - q]+); induces pi exactly (pi is normalized).

    q = 0: a token the draft gives no mass has an infinite contrastive factor. We floor q at ``q_floor``
    (default 1e-6) inside the factor only, so pi stays finite and well defined; with a one-hot (token-only)
    draft this makes pi close to p with the drafted token down-weighted.
    """

    lam: float = 0.5
    q_floor: float = 1e-6
    name: ClassVar[str] = "cos-cd"
    equation: ClassVar[str] = "Eq. 3, 7"
    param_names: ClassVar[tuple[str, ...]] = ("lam", "q_floor")

    def __post_init__(self) -> None:
        check_lam(self.lam)
        check_range("q_floor", self.q_floor)

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        w = p * torch.clamp(q, min=self.q_floor).pow(-self.lam)
        return w / w.sum(-1, keepdim=True)

    def greedy_reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Eq. 3 itself (normalized), whose argmax greedy verification emits."""
        return self.reference(p, q)


@dataclass(frozen=True)
class OvershootCeiling(UnnormalizedReferenceRule):
    """Ablation of section 4 ("overshoot ceiling", Table 1): P = lam p + (1 - lam) q where q <= p/lam, else p/lam.

    P is not normalized in general; ``realization`` says how it is run (see
    :class:`~verispec.core.rules.base.UnnormalizedReferenceRule`): "normalized" (default) induces P / sum(P) exactly;
    "residual" (h = min(1, P/q), r = norm([P - q]+)) induces q + (R / TV)(p - q) on q <= p, an adaptive
    coefficient again, not the lam p + (1 - lam) q Section 4 writes. Table 6's ceiling (row 4) is the
    ``ceiling`` rule.
    """

    lam: float = 0.5
    name: ClassVar[str] = "overshoot-ceiling"
    equation: ClassVar[str] = "Sec. 4 (ceiling variant), Table 1"
    param_names: ClassVar[tuple[str, ...]] = ("lam", "realization")
    param_ranges: ClassVar[dict[str, tuple[float, float, bool, bool]]] = _POSITIVE_LAM

    def __post_init__(self) -> None:
        check_range("lam", self.lam, self.param_ranges["lam"])  # the ceiling is p / lam
        self._check_realization()

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        ceiling = p / self.lam
        return torch.where(q <= ceiling, self.lam * p + (1 - self.lam) * q, ceiling)


@dataclass(frozen=True)
class AdaptiveInterpolation(UnnormalizedReferenceRule):
    """Ablation of section 4 ("adaptive interpolation", Table 1): P = q + Delta (p - q) where q <= p, with Delta
    of Eq. 11 computed with l = lam, and the CoS mixture lam p + (1 - lam) q (Eq. 2) where q > p.

    Not normalized in general; ``realization`` (see :class:`~verispec.core.rules.base.UnnormalizedReferenceRule`):
    "normalized" (default) induces P / sum(P), Delta included; "residual" (h = min(1, P/q),
    r = norm([P - q]+), falling back to norm([p - q]+) when Delta = 0) induces exactly CoS-WE(lam), Eq. 8:
    Delta never acts (docs/paper_notes.md).
    """

    lam: float = 0.5
    name: ClassVar[str] = "adaptive-interpolation"
    equation: ClassVar[str] = "Sec. 4 (adaptive variant), Eq. 11, Table 1"
    param_names: ClassVar[tuple[str, ...]] = ("lam", "realization")
    param_ranges: ClassVar[dict[str, tuple[float, float, bool, bool]]] = _POSITIVE_LAM

    def __post_init__(self) -> None:
        check_range("lam", self.lam, self.param_ranges["lam"])  # Delta (Eq. 11 with l = lam) divides by lam
        self._check_realization()

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        delta = lenience_delta(p, q, self.lam)
        return torch.where(q <= p, q + delta * (p - q), self.lam * p + (1 - self.lam) * q)


@dataclass(frozen=True)
class Ceiling(UnnormalizedReferenceRule):
    """Overshoot ceiling of Table 6 (row 4, App. E): P = q where q <= p/l, p/l where q >= p/l, i.e.
    P = min(q, p/l); lenience (Eq. 10) without its adaptive interpolation on q <= p.

    sum(P) <= 1. ``realization``: "normalized" (default) induces min(q, p/l) / sum(min(q, p/l)) exactly;
    "residual" has [P - q]+ = 0 everywhere, so the rejected mass goes to lenience's residual norm([p - q]+)
    (App. A) and the rule IS lenience(l) (Eq. 9-11). Section 4's "overshoot ceiling" (lam p + (1 - lam) q
    below the ceiling) is the different rule ``overshoot-ceiling``.
    """

    l: float = 0.5
    name: ClassVar[str] = "ceiling"
    equation: ClassVar[str] = "Table 6 (row 4), App. E"
    param_names: ClassVar[tuple[str, ...]] = ("l", "realization")

    def __post_init__(self) -> None:
        check_l(self.l)
        self._check_realization()

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.minimum(q, p / self.l)


@dataclass(frozen=True)
class MinPCap(UnnormalizedReferenceRule):
    """Min-p-gated overshoot cap (Appendix E, Table 6 last row): P = q on the min-p set A of p (Eq. 5),
    min(q, p/l) outside it.

    sum(P) <= 1. ``realization``: "normalized" (default) induces P / sum(P) exactly. "residual" is h = 1 on A
    and min(1, p/(l q)) outside A, so the accept path is exactly the yield P; since P <= q everywhere, [P - q]+
    has no mass and the rejected mass goes to the lenience residual norm([p - q]+) (Appendix A), as in the
    lenience rule this one modifies.
    """

    p_base: float = 0.5
    l: float = 0.5
    name: ClassVar[str] = "minp-cap"
    equation: ClassVar[str] = "App. E, Table 6 (last row)"
    param_names: ClassVar[tuple[str, ...]] = ("p_base", "l", "realization")

    def __post_init__(self) -> None:
        check_p_base(self.p_base)
        check_l(self.l)
        self._check_realization()

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.where(minp_mask(p, self.p_base), q, torch.minimum(q, p / self.l))
