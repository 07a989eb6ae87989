"""Lossless speculative sampling, the naive (wrong) resampling rule, and the truncation-sampling baselines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from verispec.core.rules.base import ReferenceRule, Rule, positive_residual, ratio_acceptance
from verispec.core.rules.validate import check_delta, check_epsilon, check_p_base
from verispec.core.sampling import eta_mask, minp_mask, renormalize_on

__all__ = ["DRAFT_TRUNCATIONS", "EtaSampling", "Lossless", "MinPSampling", "NaiveResample"]

DraftTruncation = Literal["none", "same"]
DRAFT_TRUNCATIONS: tuple[str, ...] = ("none", "same")


@dataclass(frozen=True)
class Lossless(ReferenceRule):
    """Leviathan et al. / Chen et al.: h = min(1, p/q), r = norm([p - q]+) (Eq. 1 of the lossy-verification
    paper; tutorial section 3.2). Induces p exactly (tutorial section 4)."""

    name: ClassVar[str] = "lossless"
    equation: ClassVar[str] = "Eq. 1; tutorial 3.2"
    lossless: ClassVar[bool] = True
    tree_rejection: ClassVar[str | None] = "residual"

    def reference(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return p


@dataclass(frozen=True)
class NaiveResample(Rule):
    """LOSSY diagnostic: h = min(1, p/q) but a rejection redraws from p itself (tutorial section 7).

    Induces min(p, q) + (1 - sum min(p, q)) p, which is not p: kept to show what a wrong correction does.
    """

    name: ClassVar[str] = "naive-resample"
    equation: ClassVar[str] = "tutorial 7 (wrong rule)"

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return ratio_acceptance(p, q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return p / p.sum(-1, keepdim=True)


@dataclass(frozen=True)
class _TruncatedLossless(Rule):
    """Lossless verification against a truncated target p_Theta (Eq. 4): the matched baselines of section 5.

    ``draft_truncation`` says what the draft samples from (:meth:`draft`, the transform the engine, the offline
    estimator, the Figure-4 simulation and ``verispec analyze`` all apply to q):

    * ``"none"`` (default): q untouched. This is the paper's protocol: the baseline reuses the same draft
      trajectories as the lossy rule (App. C), and Lemma 1 / Figure 4 compare sum min(p_Theta, q) with
      sum min(p, q) for the same q.
    * ``"same"``: q truncated by the same strategy on its own distribution, as a warper applied to both models
      would do (verispec's behaviour before this option existed).

    Either way the output is p_Theta exactly; only the acceptance (BE) differs. In a tree the rule is verified as
    plain lossless SD on p_Theta (:meth:`tree_verifier`).
    """

    draft_truncation: DraftTruncation = field(default="none", kw_only=True)
    lossless: ClassVar[bool] = True

    def _check_draft_truncation(self) -> None:
        if self.draft_truncation not in DRAFT_TRUNCATIONS:
            raise ValueError(f"draft_truncation must be 'none' or 'same', got {self.draft_truncation!r}")

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def target(self, p: torch.Tensor) -> torch.Tensor:
        return renormalize_on(p, self.allowed(p))

    def draft(self, q: torch.Tensor) -> torch.Tensor:
        if self.draft_truncation == "none":
            return q
        return renormalize_on(q, self.allowed(q))

    def tree_verifier(self) -> Rule:
        return Lossless()

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return ratio_acceptance(self.target(p), q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        pt = self.target(p)
        return positive_residual(torch.clamp(pt - q, min=0), pt)


@dataclass(frozen=True)
class MinPSampling(_TruncatedLossless):
    """Min-p sampling + lossless SD: target p_Theta with A = {p >= p_base max p} (Eq. 4-5)."""

    p_base: float = 0.1
    name: ClassVar[str] = "minp-sampling"
    equation: ClassVar[str] = "Eq. 4-5 + Eq. 1"
    param_names: ClassVar[tuple[str, ...]] = ("p_base", "draft_truncation")

    def __post_init__(self) -> None:
        check_p_base(self.p_base)
        self._check_draft_truncation()

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        return minp_mask(p, self.p_base)


@dataclass(frozen=True)
class EtaSampling(_TruncatedLossless):
    """Eta-sampling + lossless SD: target p_Theta with A = {p >= min(eps, delta e^-H(p))} (Eq. 4, 6)."""

    epsilon: float = 0.1
    delta: float | None = None
    name: ClassVar[str] = "eta-sampling"
    equation: ClassVar[str] = "Eq. 4, 6 + Eq. 1"
    param_names: ClassVar[tuple[str, ...]] = ("epsilon", "delta", "draft_truncation")

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        self._check_draft_truncation()

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        return eta_mask(p, self.epsilon, self.delta)
