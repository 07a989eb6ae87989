"""Truncation-based verification (Definition 1, Eq. 12-13 of the lossy-verification paper): SpecCascade
(min-p allowed set) and typical acceptance (eta allowed set). Both are lossy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from verispec.core.rules.base import Rule, positive_residual
from verispec.core.rules.validate import check_delta, check_epsilon, check_p_base
from verispec.core.sampling import eta_mask, eta_threshold, minp_mask, renormalize_on

__all__ = ["ACCEPTANCE_FORMS", "SpecCascade", "Typical", "TruncationRule"]

Correction = Literal["draft", "target"]
AcceptanceForm = Literal["indicator", "ratio"]
ACCEPTANCE_FORMS: tuple[str, ...] = ("indicator", "ratio")


@dataclass(frozen=True)
class TruncationRule(Rule):
    """h(x) = 1[x in A_Theta(p)] (Eq. 12).

    correction="draft" (default): a rejection redraws from q restricted to A and renormalized. The position
    then emits q / Z_Theta(q) on A, exactly Eq. 13, without another target call. When Z_Theta(q) = 0 (the
    draft puts no mass on A) Eq. 13 is undefined and the position emits p_Theta instead.

    correction="target": a rejection redraws from the truncated target p_Theta, which induces
    q 1_A + (1 - Z_Theta(q)) p_Theta (a mixture of Eq. 13 and the matched baseline).

    The bonus token after a fully accepted block is drawn from p_Theta (Appendix H.1).

    In a tree (App. H.1, Lemma 3(ii)) the walk applies :meth:`acceptance` to the truncated target p_Theta (the
    distribution the tree verifier scores), keeps p_Theta after a rejected candidate, and draws the bonus from it.
    """

    correction_source: Correction = "draft"
    tree_rejection: ClassVar[str | None] = "keep"

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
    delta defaults to epsilon as in Eq. 28.

    ``acceptance_form`` (alias ``acceptance``) picks the reading of Eq. 28, for chains and trees alike, as a
    function of the distribution the verifier scores (p in a chain, p_Theta in a tree):

    * ``"indicator"`` (default): h(x) = 1[x in A_eta] (Eq. 12, Definition 1);
    * ``"ratio"``: h(x) = min{p(x) / tau, 1}, tau = min(eps, delta e^{-H(p)}) (Eq. 28 as printed), fractional
      where p(x) < tau, i.e. outside A_eta (in a tree, where p_Theta is scored, h = 0 outside A_eta(p)).
    """

    epsilon: float = 0.1
    delta: float | None = None
    acceptance_form: AcceptanceForm = "indicator"
    name: ClassVar[str] = "typical"
    equation: ClassVar[str] = "Def. 1, Eq. 6, 12, 13, 28"
    param_names: ClassVar[tuple[str, ...]] = ("epsilon", "delta", "correction_source", "acceptance_form")

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        self._check_correction()
        if self.acceptance_form not in ACCEPTANCE_FORMS:
            raise ValueError(f"acceptance must be 'indicator' or 'ratio', got {self.acceptance_form!r}")

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        return eta_mask(p, self.epsilon, self.delta)

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.acceptance_form == "indicator":
            return super().acceptance(p, q)
        return torch.clamp(p / eta_threshold(p, self.epsilon, self.delta), max=1.0)
