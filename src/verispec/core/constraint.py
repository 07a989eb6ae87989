"""Token constraints (structured output) as a processor on p and q alike.

A :class:`Constraint` says which tokens may come next after a row's committed tokens plus a candidate prefix. The
engine masks the target's logits at every position of a proposal by the mask of that position's prefix, and the
drafters mask the draft's logits the same way, so verification compares p' and q', the constrained target and
draft (p' proportional to p on the allowed set): every rule keeps its exactness with respect to the constrained
target, and lossless decoding samples p' exactly. Masking happens before the logit bias, the penalties and the
temperature, so a masked token stays impossible whatever they do.

The grammar itself lives with the tokenizer (:mod:`verispec.runtime.grammar`); this module only states the
protocol and the masking, so the drafters can apply it without knowing the grammar library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Constraint", "constrain_logits"]


@runtime_checkable
class Constraint(Protocol):
    """Which tokens may follow the committed tokens plus a candidate prefix."""

    def allowed(self, prefix: Sequence[int]) -> torch.Tensor | None:
        """Bool mask [V] of the tokens allowed after the committed tokens then ``prefix``; None when the prefix
        cannot occur (it leaves the grammar, or follows an end token): such a position is never reached, so its
        distribution is left unconstrained."""
        ...

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the constraint allows in a row after the committed tokens."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past ``tokens`` (emitted; every one allowed)."""
        ...


def constrain_logits(logits: torch.Tensor, masks: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """``logits`` [n, V] with row i's disallowed tokens at -inf (``masks[i]`` None: row i unchanged)."""
    if all(m is None for m in masks):
        return logits
    out = logits.clone()
    for i, m in enumerate(masks):
        if m is not None:
            out[i] = out[i].masked_fill(~m[: out.shape[-1]].to(out.device), float("-inf"))
    return out
