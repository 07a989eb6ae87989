"""Adaptive draft length: pick gamma each round to maximize expected tokens per second.

Model (the standard i.i.d. one of Leviathan et al.): each drafted token is accepted with probability alpha
given the previous ones were, so a round with gamma drafts yields E[tokens] = sum_{i=0}^{gamma} alpha^i
(bonus/correction included), and costs gamma * c_draft + c_target. alpha, c_draft and c_target are running
averages of what the engine measures.
"""

from __future__ import annotations

__all__ = ["AdaptiveGamma", "expected_tokens"]


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per round, sum_{i=0}^{gamma} alpha^i (Leviathan et al., Eq. 1 form)."""
    return sum(alpha**i for i in range(gamma + 1))


class AdaptiveGamma:
    """Running estimates + argmax over gamma in [0, gamma_max] of E[tokens](gamma) / cost(gamma)."""

    def __init__(self, gamma_max: int = 8, alpha: float = 0.7, decay: float = 0.1) -> None:
        if gamma_max < 0:
            raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.gamma_max, self.alpha, self.decay = gamma_max, alpha, decay
        self.c_draft: float | None = None  # seconds per drafted token
        self.c_target: float | None = None  # seconds per target forward

    def choose(self) -> int:
        if self.c_draft is None or self.c_target is None:
            return self.gamma_max  # measure first
        return max(
            range(self.gamma_max + 1),
            key=lambda g: expected_tokens(self.alpha, g) / (g * self.c_draft + self.c_target),  # type: ignore[operator]
        )

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.decay) * old + self.decay * new

    def update(self, drafted: int, accepted: int, draft_s: float, target_s: float) -> None:
        """Fold in one round: ``accepted`` of ``drafted`` tokens; the positions reached were min(drafted,
        accepted + 1), each a Bernoulli(alpha) trial."""
        if drafted:
            reached = min(drafted, accepted + 1)
            self.alpha = min(max(self._ema(self.alpha, accepted / reached), 0.0), 0.999)
            self.c_draft = self._ema(self.c_draft, draft_s / drafted)
        elif self.c_draft is None:
            self.c_draft = 0.0
        self.c_target = self._ema(self.c_target, target_s)
