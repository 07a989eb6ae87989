"""What every drafter returns: candidate tokens and the exact distribution each was drawn from (or None)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..processors import SamplingConfig
from ..rules import Rule

__all__ = ["Draft", "DraftContext", "Drafter"]


@dataclass
class Draft:
    """``tokens`` [gamma]; ``q`` [gamma, V] float64, the distributions the tokens were sampled from, or None for a
    token-only draft (the verifier then uses one-hot q, tutorial 3.3)."""

    tokens: list[int]
    q: torch.Tensor | None = None
    seconds: float = 0.0
    forward_calls: int = 0


@dataclass
class DraftContext:
    """What a drafter may use besides the committed ids: the sampling config (applied identically to the
    target), the rule (for its draft transform), the generator, and the committed history's token counts."""

    cfg: SamplingConfig
    rule: Rule
    generator: torch.Generator | None = None
    counts: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


class Drafter(Protocol):
    name: str

    def propose(self, ids: list[int], gamma: int, ctx: DraftContext) -> Draft: ...

    def reset(self) -> None: ...
