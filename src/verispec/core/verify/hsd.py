"""Hierarchical speculative decoding (HSD; Zhou et al., 2026, "Overcoming Joint Intractability with Lossless
Hierarchical Speculative Decoding"): a lossless verifier of a whole chain that first tests the joint likelihood
ratio of all gamma drafts and, on rejection, steps back through the prefixes, resampling at the first depth (from
the deepest) whose branch has target mass to spare.

Names as in :mod:`verispec.core.verify.chain`: drafts x_1 .. x_gamma from q_1 .. q_gamma, target distributions
p_1 .. p_{gamma+1}. With the prefix likelihood ratios and their running maximum

    L_k = prod_{j <= k} p_j(x_j) / q_j(x_j),   M_k = max(1, L_1, .., L_k),   rho_k = L_k / M_k in [0, 1]
    (rho_0 = 1; a token with q_j(x_j) = 0, which cannot have been drawn, makes rho_k = 0 from j on),

the round is:

1. accept all gamma drafts with probability rho_gamma (then the bonus from p_{gamma+1});
2. otherwise, for depth i = gamma, gamma - 1, .., 1 with the branch residual d_i = rho_{i-1} p_i - q_i,
   alpha_i = sum [d_i]+ and beta_i = sum [-d_i]+: stop at depth i with probability alpha_i / max(alpha_i, beta_i),
   keeping x_1 .. x_{i-1} and drawing the correction from [d_i]+ / alpha_i; else step back to depth i - 1.
   Depth 1 (rho_0 = 1) has alpha_1 = beta_1 = TV(p_1, q_1): the walk always stops there if nowhere deeper.

The capping by the running maximum is what makes it lossless: a branch whose target mass exceeds the draft's
(L > 1) can only be reached by the draft with the draft's mass, so its deeper tests are made relative to that cap,
and the excess comes back through the residuals of shallower depths. In joint terms d_i is
P~_{i-1} p_i - Q_{i-1} q_i divided by Q_{i-1} (P~ the capped target mass of the prefix, Q the draft's), the form in
which the paper and its code write it; the ratios keep every quantity in [0, 1] whatever gamma (no underflow).

The paper's code base computes the full-acceptance probability as min(1, L_gamma) and caps the prefix only where
the ratio sets a new maximum (leaving 1 elsewhere); on enumerated toy models neither reading is lossless, while
the one above is equal to the target's law to rounding (docs/paper_notes.md; tests/core/test_hsd.py). With one draft it
is token-wise verification. At temperature 0 (one-hot p and q) rho is 1 while the drafts match the argmax and 0
after, so it accepts exactly the matching prefix: the engine keeps its exact greedy path. Like block verification
it verifies the lossless law only: :func:`verispec.analysis.sequence.round_law` with ``verifier="hsd"`` is its
exact law.
"""

from __future__ import annotations

import torch

from verispec.core.verify.chain import VerifyResult, finish_chain, prepare_chain

__all__ = ["hsd_ratios", "hsd_residual", "hsd_stop", "verify_chain_hsd"]


def hsd_ratios(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """rho [B, gamma + 1]: rho_0 = 1, rho_k = L_k / max(1, L_1 .. L_k) (module docstring), from log-ratios so that
    long chains of small probabilities do not underflow; 0 from a token with q_j(x_j) = 0 on."""
    b, gamma = draft_tokens.shape
    at = draft_tokens.unsqueeze(-1)
    px = p[:, :gamma].gather(-1, at).squeeze(-1)
    qx = q.gather(-1, at).squeeze(-1)
    drawable = (qx > 0).long().cumprod(-1).bool()
    step = torch.where(drawable & (px > 0), px.log() - torch.where(qx > 0, qx, torch.ones_like(qx)).log(),
                       torch.full_like(px, -torch.inf))
    log_l = torch.cat([torch.zeros(b, 1, dtype=torch.float64, device=p.device), step.cumsum(-1)], -1)
    log_m = torch.cummax(log_l.clamp(min=0.0), -1).values  # log L_0 = 0, so the max with 1 is included
    return torch.where(torch.isfinite(log_l), (log_l - log_m).exp(), torch.zeros_like(log_l))


def hsd_stop(rho: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[B, gamma]: the probability of stopping at depth i = 1 .. gamma (index i - 1) once the walk reaches it,
    alpha_i / max(alpha_i, beta_i) with d_i = rho_{i-1} p_i - q_i (0 where alpha_i = 0)."""
    gamma = q.shape[1]
    d = rho[:, :gamma].unsqueeze(-1) * p[:, :gamma] - q
    alpha, beta = d.clamp(min=0).sum(-1), (-d).clamp(min=0).sum(-1)
    top = torch.maximum(alpha, beta)
    return torch.where(alpha > 0, alpha / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(alpha))


def hsd_residual(rho_prev: torch.Tensor, p_i: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
    """[B, V]: the correction at a depth, [rho_{i-1} p_i - q_i]+ normalized (p_i where it has no mass: a stop
    there has probability zero, the fallback only guards rounding)."""
    r = (rho_prev.unsqueeze(-1) * p_i - q_i).clamp(min=0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, torch.ones_like(mass)), p_i)


def verify_chain_hsd(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """HSD-verify ``gamma`` drafted tokens per row (module docstring); same shapes, dtypes and input contract as
    :func:`~verispec.core.verify.chain.verify_block` (q None: a token-only draft, one-hot q). Randomness: one
    float64 uniform for the whole block, gamma for the depths, then one for the final token, all from
    ``generator``. ``accept_prob`` holds rho_1 .. rho_gamma (rho_gamma: the whole block's acceptance)."""
    draft_tokens, q, p = prepare_chain(draft_tokens, q, p)
    b, gamma = draft_tokens.shape
    rho = hsd_ratios(draft_tokens, q, p)
    if not gamma:
        return finish_chain(draft_tokens, torch.zeros(b, dtype=torch.long, device=p.device), p, None, rho[:, :0],
                            generator)
    stop = hsd_stop(rho, q, p)
    u = torch.rand(b, gamma + 1, dtype=torch.float64, generator=generator, device=p.device)
    whole = u[:, 0] < rho[:, gamma]
    # walking down from depth gamma and stopping at the first depth whose test passes = the deepest passing one
    depth = torch.arange(1, gamma + 1, device=p.device).expand(b, gamma)
    deepest = torch.where(u[:, 1:] < stop, depth, torch.zeros_like(depth)).max(-1).values
    tau = torch.where(whole, torch.full_like(deepest, gamma), (deepest - 1).clamp(min=0))
    rows, at = torch.arange(b, device=p.device), torch.clamp(tau, max=gamma - 1)
    r = hsd_residual(rho[rows, at], p[rows, at], q[rows, at])
    return finish_chain(draft_tokens, tau, p, r, rho[:, 1:], generator)
