"""Truncation-based verification (Definition 1, Eq. 12-13 of the lossy-verification paper): SpecCascade
(min-p allowed set) and typical acceptance (eta allowed set). Both are lossy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..processors import eta_mask, minp_mask, renormalize_on
from .base import Rule, positive_residual
from .validate import check_delta, check_epsilon, check_p_base

__all__ = ["SpecCascade", "Typical", "TruncationRule"]

Correction = Literal["draft", "target"]


@dataclass(frozen=True)
class TruncationRule(Rule):
    """h(x) = 1[x in A_Theta(p)] (Eq. 12).

    correction="draft" (default): a rejection redraws from q restricted to A and renormalized. The position
    then emits q / Z_Theta(q) on A, exactly Eq. 13, without another target call. When Z_Theta(q) = 0 (the
    draft puts no mass on A) Eq. 13 is undefined and the position emits p_Theta instead.

    correction="target": a rejection redraws from the truncated target p_Theta, which induces
    q 1_A + (1 - Z_Theta(q)) p_Theta (a mixture of Eq. 13 and the matched baseline).

    The bonus token after a fully accepted block is drawn from p_Theta (Appendix H.1).
    """

    correction_source: Correction = "draft"

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _check_correction(self) -> None:
        if self.correction_source not in ("draft", "target"):
            raise ValueError(f"correction must be 'draft' or 'target', got {self.correction_source!r}")

    def target(self, p: torch.Tensor) -> torch.Tensor:
        return renormalize_on(p, self.allowed(p))

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self.allowed(p).to(p.dtype)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        pt = self.target(p)
        if self.correction_source == "target":
            return pt
        return positive_residual(torch.where(self.allowed(p), q, torch.zeros_like(q)), pt)


@dataclass(frozen=True)
class SpecCascade(TruncationRule):
    """SpecCascade (Narasimhan et al.) as truncation-based verification with the min-p set (Eq. 5, 12, 13)."""

    p_base: float = 0.1
    name: ClassVar[str] = "spec-cascade"
    equation: ClassVar[str] = "Def. 1, Eq. 5, 12, 13"
    param_names: ClassVar[tuple[str, ...]] = ("p_base", "correction_source")

    def __post_init__(self) -> None:
        check_p_base(self.p_base)
        self._check_correction()

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        return minp_mask(p, self.p_base)


@dataclass(frozen=True)
class Typical(TruncationRule):
    """Typical acceptance (Medusa) as truncation-based verification with the eta set (Eq. 6, 12, 13, 28);
    delta defaults to epsilon as in Eq. 28."""

    epsilon: float = 0.1
    delta: float | None = None
    name: ClassVar[str] = "typical"
    equation: ClassVar[str] = "Def. 1, Eq. 6, 12, 13, 28"
    param_names: ClassVar[tuple[str, ...]] = ("epsilon", "delta", "correction_source")

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        self._check_correction()

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        return eta_mask(p, self.epsilon, self.delta)
