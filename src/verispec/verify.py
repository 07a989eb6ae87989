"""The one generic, batched sampler of a verification rule over a chain of drafted tokens.

``verify_block`` applies any :class:`~verispec.rules.Rule` to a whole block: it accepts drafted token i with
probability h_i(x_i) using a float64 uniform, stops at the first rejection, draws the correction there from
r_i, or draws the bonus token from the rule's bonus distribution at position gamma when all are accepted
(tutorial sections 3-5). ``verify_greedy`` is the exact temperature-0 path: accept iff the draft equals the
target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .rules import Rule

__all__ = ["VerifyResult", "sample_categorical", "verify_block", "verify_greedy"]


@dataclass
class VerifyResult:
    """Outcome of verifying one block per row.

    ``num_accepted`` [B]: accepted drafted tokens n (0..gamma). ``tokens`` [B, gamma + 1]: the emitted tokens,
    the accepted prefix then one correction or bonus token, padded with -1 after position n. ``h`` [B, gamma]:
    the acceptance probabilities used (1 or 0 on the greedy path). ``bonus`` [B]: True where all drafted tokens
    were accepted and the last token is the bonus.
    """

    num_accepted: torch.Tensor
    tokens: torch.Tensor
    h: torch.Tensor

    @property
    def bonus(self) -> torch.Tensor:
        return self.num_accepted == self.h.shape[-1]

    def emitted(self, row: int = 0) -> list[int]:
        """The emitted token ids of one row (accepted prefix + correction/bonus)."""
        n = int(self.num_accepted[row])
        return [int(t) for t in self.tokens[row, : n + 1]]


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row by inverting the float64 CDF with a float64 uniform.

    ``searchsorted(..., right=True)`` returns the first index whose CDF exceeds u, so an index with zero
    probability (a flat step of the CDF) is never returned; u is kept strictly below the total mass.
    """
    if probs.dtype != torch.float64:
        probs = probs.to(torch.float64)
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    if not bool((total > 0).all()):
        raise ValueError("cannot sample from a distribution with no mass")
    u = torch.rand(total.shape, dtype=torch.float64, generator=generator, device=probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, u, right=True)
    return idx.squeeze(-1)


def _check_block(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [batch, gamma], got shape {tuple(draft_tokens.shape)}")
    b, gamma = draft_tokens.shape
    if p.dim() != 3 or p.shape[0] != b or p.shape[1] != gamma + 1:
        raise ValueError(f"p must be [batch, gamma + 1, V] = [{b}, {gamma + 1}, V], got {tuple(p.shape)}")
    if q is not None and (q.shape[:2] != (b, gamma) or q.shape[-1] != p.shape[-1]):
        raise ValueError(f"q must be [batch, gamma, V] = [{b}, {gamma}, {p.shape[-1]}], got {tuple(q.shape)}")
    if torch.isnan(p).any() or (q is not None and torch.isnan(q).any()):
        raise ValueError("NaN in p or q")


def verify_block(
    rule: Rule,
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Verify a block of ``gamma`` drafted tokens per row with ``rule``.

    draft_tokens [B, gamma] (long); q [B, gamma, V] the distributions the tokens were drawn from, or None for a
    token-only draft (q is then one-hot on each token, tutorial 3.3); p [B, gamma + 1, V] the target's
    distributions at the gamma drafted positions and the bonus position. Randomness: gamma float64 uniforms
    for the accept tests, then one for the final token, all from ``generator``.
    """
    _check_block(draft_tokens, q, p)
    p = p.to(torch.float64)
    b, gamma = draft_tokens.shape
    if q is None:
        q = torch.zeros(b, gamma, p.shape[-1], dtype=torch.float64, device=p.device)
        q.scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    else:
        q = q.to(torch.float64)
    rows = torch.arange(b, device=p.device)

    if gamma:
        h = rule.acceptance(p[:, :gamma], q).gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        u = torch.rand(b, gamma, dtype=torch.float64, generator=generator, device=p.device)
        accepted = (u < h).long().cumprod(-1)
        n = accepted.sum(-1)
    else:
        h = torch.zeros(b, 0, dtype=torch.float64, device=p.device)
        n = torch.zeros(b, dtype=torch.long, device=p.device)

    # Only the row's stopping position needs a correction distribution: gather it, then compute r there.
    at = torch.clamp(n, max=max(gamma - 1, 0))
    final = rule.bonus(p[rows, n])
    if gamma:
        rejected = (n < gamma).unsqueeze(-1)
        r = rule.correction(p[rows, at], q[rows, at])
        final = torch.where(rejected, r, final)
    last = sample_categorical(final, generator)

    tokens = torch.full((b, gamma + 1), -1, dtype=torch.long, device=p.device)
    if gamma:
        keep = torch.arange(gamma, device=p.device).unsqueeze(0) < n.unsqueeze(-1)
        tokens[:, :gamma] = torch.where(keep, draft_tokens, tokens[:, :gamma])
    tokens[rows, n] = last
    return VerifyResult(num_accepted=n, tokens=tokens, h=h)


def verify_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> VerifyResult:
    """Exact greedy verification: accept drafted token i iff it equals the target's argmax at i.

    ``target_argmax`` [B, gamma + 1] holds the target's greedy token at each drafted position and the bonus
    position; the emitted sequence is exactly what the target's own greedy decode would produce.
    """
    b, gamma = draft_tokens.shape
    if target_argmax.shape != (b, gamma + 1):
        raise ValueError(f"target_argmax must be [{b}, {gamma + 1}], got {tuple(target_argmax.shape)}")
    match = (draft_tokens == target_argmax[:, :gamma]).long()
    n = match.cumprod(-1).sum(-1)
    rows = torch.arange(b, device=draft_tokens.device)
    tokens = torch.full((b, gamma + 1), -1, dtype=torch.long, device=draft_tokens.device)
    keep = torch.arange(gamma, device=draft_tokens.device).unsqueeze(0) < n.unsqueeze(-1)
    tokens[:, :gamma] = torch.where(keep, draft_tokens, tokens[:, :gamma])
    tokens[rows, n] = target_argmax[rows, n]
    return VerifyResult(num_accepted=n, tokens=tokens, h=match.to(torch.float64))
