"""The one generic, batched sampler of a verification rule over a chain of drafted tokens.

Names (tutorial sections 3-5; vLLM's rejection sampler calls the correction the *recovered* token):

* **drafted** tokens x_1 .. x_gamma, x_i proposed by the draft from q_i;
* **accepted**: drafted token i is kept with probability h_i(x_i) = ``rule.acceptance(p_i, q_i)[x_i]``
  (``VerifyResult.accept_prob``); the block stops at the first rejection, so the accepted drafts are a prefix
  of n tokens (``num_accepted``);
* **correction** (vLLM: recovered token): the token drawn from r_{n+1} = ``rule.correction(p, q)`` at the first
  rejected position;
* **bonus**: the token drawn from ``rule.bonus(p)`` (p, or p_Theta) at position gamma + 1 when all gamma drafts
  were accepted;
* **emitted**: the accepted prefix followed by exactly one correction or bonus token (n + 1 tokens).

``verify_block`` applies any :class:`~verispec.core.rules.Rule` to a whole block with float64 uniforms.
``verify_greedy`` is the exact temperature-0 path of lossless SD (accept iff the draft equals the target's
argmax); ``verify_greedy_rule`` is the deterministic temperature-0 reading of ANY rule: accept iff the draft
equals the argmax of ``rule.greedy_reference(p, q)`` built from the untempered p and q.

Input contract (violations raise ValueError naming the argument and the problem): p and q rows are probability
distributions (finite, non-negative, summing to 1 within ``SUM_TOL``), draft ids are integers (int32 or int64)
inside the vocabulary. A drafted token to which its own q gives probability 0 cannot have been drawn from q:
it is rejected (h = 0), never accepted, so a lossless rule never emits a token with p(x) = 0.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from verispec.core.rules import Rule

__all__ = [
    "SUM_TOL",
    "VerifyResult",
    "as_float64",
    "check_distribution",
    "emitted_tokens",
    "finish_chain",
    "prepare_chain",
    "sum_tolerance",
    "sample_categorical",
    "verify_block",
    "verify_greedy",
    "verify_greedy_rule",
]

#: how far from 1 a row of p or q may sum (float32 softmax over 150k tokens stays well inside it); half-precision
#: rows get a dtype-aware tolerance (:func:`sum_tolerance`)
SUM_TOL = 1e-4
#: input dtypes whose rows are renormalized after the float64 upcast (their rounding leaves sums off 1 by ~eps)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def sum_tolerance(dtype: torch.dtype, n: int = 1) -> float:
    """How far from 1 a row of ``n`` entries of ``dtype`` may sum: :data:`SUM_TOL`, or for a half-precision dtype
    2 eps (rounding moves an entry by at most eps / 2 of itself; the rest leaves room for a softmax computed in
    that dtype: bfloat16 0.0156, float16 0.00195) plus n times half its smallest subnormal (an entry below that
    rounds to 0: float16 flushes every entry under 3e-8, which over a 150k-token vocabulary can be 0.0045 of the
    mass; for bfloat16, with float32's range, nothing)."""
    if dtype not in LOW_PRECISION:
        return SUM_TOL
    info = torch.finfo(dtype)
    return max(SUM_TOL, 2 * info.eps + n * info.tiny * info.eps / 2)


def as_float64(x: torch.Tensor) -> torch.Tensor:
    """Rows of probabilities in float64; a half-precision row is renormalized, so the rule sees (and the exact
    analysis computes with) an exact distribution."""
    y = x.to(torch.float64)
    return y / y.sum(-1, keepdim=True) if x.dtype in LOW_PRECISION else y


@dataclass
class VerifyResult:
    """Outcome of verifying one block per row.

    ``num_accepted`` [B]: accepted drafted tokens n (0..gamma). ``tokens`` [B, gamma + 1]: the emitted tokens,
    the accepted prefix then one correction or bonus token, padded with -1 after position n. ``accept_prob``
    [B, gamma]: the acceptance probability h_i(x_i) each drafted token was tested with (1 or 0 on the
    deterministic greedy paths; 0 for a token its q gives no mass). ``bonus`` [B]: True where all drafted tokens
    were accepted and the last token is the bonus.
    """

    num_accepted: torch.Tensor
    tokens: torch.Tensor
    accept_prob: torch.Tensor

    @property
    def h(self) -> torch.Tensor:
        """Deprecated alias of :attr:`accept_prob` (the paper's h)."""
        warnings.warn("VerifyResult.h is deprecated; use accept_prob", DeprecationWarning, stacklevel=2)
        return self.accept_prob

    @property
    def bonus(self) -> torch.Tensor:
        return self.num_accepted == self.accept_prob.shape[-1]

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


# ------------------------------------------------------------------------------------------------ contracts


def check_distribution(name: str, x: torch.Tensor, tol: float | None = None) -> None:
    """Raise ValueError naming ``name`` unless every row (last dim) of ``x`` is a probability distribution, its sum
    within ``tol`` of 1 (default: :func:`sum_tolerance` of its dtype)."""
    if tol is None:
        tol = sum_tolerance(x.dtype, x.shape[-1] if x.dim() else 1)
    if x.is_complex() or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got dtype {x.dtype}")
    if x.numel() == 0:
        return
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{name} contains NaN: pass probability distributions")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains inf: pass probability distributions, not logits")
    low = float(x.min())
    if low < 0:
        raise ValueError(f"{name} has negative entries (min {low:.3g}): pass probabilities, not logits")
    sums = x.to(torch.float64).sum(-1)
    off = (sums - 1).abs()
    if bool((off > tol).any()):
        raise ValueError(f"{name} rows must sum to 1 (tolerance {tol:g}); row sums range from "
                         f"{float(sums.min()):.6g} to {float(sums.max()):.6g}")


def _check_ids(name: str, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab})")
    return ids.long()


def _check_block(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor:
    """Validate shapes and contents; return the draft ids as int64."""
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [batch, gamma], got shape {tuple(draft_tokens.shape)}")
    b, gamma = draft_tokens.shape
    if p.dim() != 3 or p.shape[0] != b or p.shape[1] != gamma + 1:
        raise ValueError(f"p must be [batch, gamma + 1, V] = [{b}, {gamma + 1}, V], got {tuple(p.shape)}")
    if q is not None and (q.dim() != 3 or q.shape[:2] != (b, gamma) or q.shape[-1] != p.shape[-1]):
        raise ValueError(f"q must be [batch, gamma, V] = [{b}, {gamma}, {p.shape[-1]}], got {tuple(q.shape)}")
    check_distribution("p", p)
    if q is not None:
        check_distribution("q", q)
    return _check_ids("draft_tokens", draft_tokens, p.shape[-1])


def _one_hot(draft_tokens: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    b, gamma = draft_tokens.shape
    q = torch.zeros(b, gamma, vocab, dtype=torch.float64, device=device)
    q.scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    return q


# ------------------------------------------------------------------------------------------------ samplers


def verify_block(
    rule: Rule,
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Verify a block of ``gamma`` drafted tokens per row with ``rule``.

    draft_tokens [B, gamma] (int32 or int64); q [B, gamma, V] the distributions the tokens were drawn from, or
    None for a token-only draft (q is then one-hot on each token, tutorial 3.3); p [B, gamma + 1, V] the target's
    distributions at the gamma drafted positions and the bonus position. p and q may be float64, float32,
    bfloat16 or float16 (half-precision rows are checked with a dtype-aware tolerance, then upcast and
    renormalized: :func:`as_float64`); everything is computed in float64. Token i is accepted with probability
    h_i(x_i) = rule.acceptance(p_i, q_i)[x_i] (Eq. 1 for lossless SD), and with probability 0 when
    q_i(x_i) = 0. Randomness: gamma float64 uniforms for the accept tests, then one for the final token, all from
    ``generator``.
    """
    draft_tokens = _check_block(draft_tokens, q, p)
    p = as_float64(p)
    b, gamma = draft_tokens.shape
    q = _one_hot(draft_tokens, p.shape[-1], p.device) if q is None else as_float64(q)
    rows = torch.arange(b, device=p.device)

    if gamma:
        at_draft = draft_tokens.unsqueeze(-1)
        h = rule.acceptance(p[:, :gamma], q).gather(-1, at_draft).squeeze(-1)
        h = torch.where(q.gather(-1, at_draft).squeeze(-1) > 0, h, torch.zeros_like(h))  # not drawn from q: reject
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
        r = rule.at(rows, at).correction(p[rows, at], q[rows, at])
        final = torch.where(rejected, r, final)
    last = sample_categorical(final, generator)

    return VerifyResult(num_accepted=n, tokens=emitted_tokens(draft_tokens, n, last), accept_prob=h)


def prepare_chain(draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft ids int64, q, p) in float64 after the input contract's checks, q one-hot for a token-only draft:
    the start of every verifier of a whole chain (:mod:`verispec.core.verify.block`, :mod:`.hsd`)."""
    draft_tokens = _check_block(draft_tokens, q, p)
    p = as_float64(p)
    q = _one_hot(draft_tokens, p.shape[-1], p.device) if q is None else as_float64(q)
    return draft_tokens, q, p


def finish_chain(draft_tokens: torch.Tensor, tau: torch.Tensor, p: torch.Tensor, residual: torch.Tensor | None,
                 accept_prob: torch.Tensor, generator: torch.Generator | None) -> VerifyResult:
    """The end of a chain verifier that kept ``tau`` drafts per row: one token from the bonus p_{tau+1} where
    tau = gamma, else from ``residual`` [B, V] (the verifier's correction at position tau; None when gamma = 0)."""
    final = p[torch.arange(p.shape[0], device=p.device), tau]
    if residual is not None:
        final = torch.where((tau < draft_tokens.shape[1]).unsqueeze(-1), residual, final)
    last = sample_categorical(final, generator)
    return VerifyResult(num_accepted=tau, tokens=emitted_tokens(draft_tokens, tau, last), accept_prob=accept_prob)


def emitted_tokens(draft_tokens: torch.Tensor, n: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """[B, gamma + 1]: each row's first n drafts, then its correction or bonus ``last``, padded with -1."""
    b, gamma = draft_tokens.shape
    tokens = torch.full((b, gamma + 1), -1, dtype=torch.long, device=draft_tokens.device)
    if gamma:
        keep = torch.arange(gamma, device=draft_tokens.device).unsqueeze(0) < n.unsqueeze(-1)
        tokens[:, :gamma] = torch.where(keep, draft_tokens, tokens[:, :gamma])
    tokens[torch.arange(b, device=draft_tokens.device), n] = last
    return tokens


def verify_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> VerifyResult:
    """Exact greedy verification: accept drafted token i iff it equals the target's argmax at i.

    ``target_argmax`` [B, gamma + 1] holds the target's greedy token at each drafted position and the bonus
    position; the emitted sequence is exactly what the target's own greedy decode would produce. Ids may be
    int32 or int64.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [batch, gamma], got shape {tuple(draft_tokens.shape)}")
    b, gamma = draft_tokens.shape
    if tuple(target_argmax.shape) != (b, gamma + 1):
        raise ValueError(f"target_argmax must be [{b}, {gamma + 1}], got {tuple(target_argmax.shape)}")
    for name, ids in (("draft_tokens", draft_tokens), ("target_argmax", target_argmax)):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    draft_tokens, target_argmax = draft_tokens.long(), target_argmax.long()
    match = (draft_tokens == target_argmax[:, :gamma]).long()
    n = match.cumprod(-1).sum(-1)
    rows = torch.arange(b, device=draft_tokens.device)
    tokens = torch.full((b, gamma + 1), -1, dtype=torch.long, device=draft_tokens.device)
    keep = torch.arange(gamma, device=draft_tokens.device).unsqueeze(0) < n.unsqueeze(-1)
    tokens[:, :gamma] = torch.where(keep, draft_tokens, tokens[:, :gamma])
    tokens[rows, n] = target_argmax[rows, n]
    return VerifyResult(num_accepted=n, tokens=tokens, accept_prob=match.to(torch.float64))


def verify_greedy_rule(
    rule: Rule,
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
) -> VerifyResult:
    """Deterministic temperature-0 verification of any rule.

    p [B, gamma + 1, V] and q [B, gamma, V] are the models' UNtempered distributions (softmax of the logits,
    penalties applied, no temperature or truncation warpers), q = None for a token-only draft (one-hot q).
    Drafted token i is accepted iff it equals argmax ``rule.greedy_reference(p_i, q_i)``; at the first rejection
    that argmax is emitted; after a fully accepted block the bonus is argmax ``rule.bonus(p)`` (= argmax p for
    every registered rule). Ties go to the first index. For lossless rules this is :func:`verify_greedy` on
    argmax p (the target's greedy decode); for CoS-WE it accepts iff the draft is argmax lam p + (1 - lam) q,
    the weighted-ensemble reading of transformers' ``assistant_ensemble_weight`` (docs/paper_notes.md).
    """
    draft_tokens = _check_block(draft_tokens, q, p)
    p = as_float64(p)
    gamma = draft_tokens.shape[1]
    q = _one_hot(draft_tokens, p.shape[-1], p.device) if q is None else as_float64(q)
    best = rule.bonus(p[:, gamma]).argmax(-1, keepdim=True)
    if gamma:
        best = torch.cat([rule.greedy_reference(p[:, :gamma], q).argmax(-1), best], -1)
    return verify_greedy(draft_tokens, best)
