"""Block verification (Sun et al., 2024, "Block Verification Accelerates Speculative Decoding", Algorithm 2): a
lossless verifier of a whole chain at once that accepts at least as many drafted tokens per round, in expectation,
as token-by-token verification (their Theorem 2), with the same output law (the target's; their Theorem 1).

Names as in :mod:`verispec.core.verify.chain`: drafts x_1 .. x_gamma from q_1 .. q_gamma, target distributions
p_1 .. p_{gamma+1} (p_{gamma+1} is the bonus position). Block verification keeps a running weight

    w_0 = 1,   w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1)                         (Alg. 2, line 4)

(the likelihood ratio of the prefix, capped at 1), and tests every prefix length i with

    h_i = m_i / (m_i + 1 - w_i),   m_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)   for i < gamma,
    h_gamma = w_gamma                                                               (Alg. 2, lines 5-7)

(h_i = 1 where m_i + 1 - w_i = 0). With independent uniforms eta_1 .. eta_gamma it keeps the LONGEST prefix
tau = max{i : eta_i <= h_i} (0 if none): a failed test at i does not stop the block, unlike token-wise
verification. Then one more token: the bonus from p_{gamma+1} when tau = gamma, else the block residual

    r_tau(x) proportional to max(w_tau p_{tau+1}(x) - q_{tau+1}(x), 0)              (Alg. 2, line 10)

which for tau = 0 (w_0 = 1) is the token-wise residual max(p_1 - q_1, 0). With gamma = 1 the two verifiers are the
same. At temperature 0 (one-hot p and q) w_i is 1 while the drafts match the argmax and 0 after, so block
verification accepts exactly the matching prefix, as token-wise does: the engine keeps its exact greedy path.

It is a verifier of the lossless law: a lossy rule's per-token acceptance has no block form in the papers, so
:func:`verify_chain_block` takes the target's p and the draft's q as they are (docs/paper_notes.md). The exact
law of what it emits is :func:`verispec.analysis.sequence.round_law` with ``verifier="block"``.
"""

from __future__ import annotations

import torch

from verispec.core.verify.chain import VerifyResult, finish_chain, prepare_chain

__all__ = ["block_acceptance", "block_residual", "block_weights", "verify_chain_block"]


def block_weights(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """w [B, gamma + 1]: w_0 = 1, w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1); 0 once a token had q_i(x_i) = 0
    (it cannot have been drawn from q). ``q`` [B, gamma, V], ``p`` [B, gamma + 1, V], float64."""
    b, gamma = draft_tokens.shape
    at = draft_tokens.unsqueeze(-1)
    px = p[:, :gamma].gather(-1, at).squeeze(-1)
    qx = q.gather(-1, at).squeeze(-1)
    ratio = torch.where(qx > 0, px / torch.where(qx > 0, qx, torch.ones_like(qx)), torch.zeros_like(px))
    w = torch.ones(b, gamma + 1, dtype=torch.float64, device=p.device)
    for i in range(1, gamma + 1):
        w[:, i] = torch.clamp(w[:, i - 1] * ratio[:, i - 1], max=1.0)
    return w


def block_acceptance(w: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """h [B, gamma]: h_i for prefix lengths i = 1 .. gamma (index i - 1), from the weights of
    :func:`block_weights`: m_i / (m_i + 1 - w_i) below gamma, w_gamma at gamma."""
    gamma = q.shape[1]
    if gamma == 0:
        return torch.zeros(w.shape[0], 0, dtype=torch.float64, device=w.device)
    h = torch.empty(w.shape[0], gamma, dtype=torch.float64, device=w.device)
    if gamma > 1:
        wi = w[:, 1:gamma].unsqueeze(-1)  # w_1 .. w_{gamma-1}
        m = torch.clamp(wi * p[:, 1:gamma] - q[:, 1:gamma], min=0.0).sum(-1)
        denom = m + 1.0 - w[:, 1:gamma]
        h[:, : gamma - 1] = torch.where(denom > 0, m / torch.where(denom > 0, denom, torch.ones_like(denom)),
                                        torch.ones_like(m))
    h[:, gamma - 1] = w[:, gamma]
    return h.clamp(0.0, 1.0)


def block_residual(w_tau: torch.Tensor, p_next: torch.Tensor, q_next: torch.Tensor) -> torch.Tensor:
    """r_tau [B, V]: max(w_tau p_{tau+1} - q_{tau+1}, 0), normalized. Its mass is positive whenever tau < gamma
    has positive probability; a row without mass (probability zero, or rounding) falls back to p_{tau+1}."""
    r = torch.clamp(w_tau.unsqueeze(-1) * p_next - q_next, min=0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, torch.ones_like(mass)), p_next)


def verify_chain_block(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Block-verify ``gamma`` drafted tokens per row (module docstring); same shapes, dtypes and input contract
    as :func:`~verispec.core.verify.chain.verify_block` (q None: a token-only draft, one-hot q). Randomness:
    gamma float64 uniforms for the prefix tests, then one for the final token, all from ``generator``.
    ``accept_prob`` holds h_1 .. h_gamma."""
    draft_tokens, q, p = prepare_chain(draft_tokens, q, p)
    b, gamma = draft_tokens.shape
    rows = torch.arange(b, device=p.device)
    w = block_weights(draft_tokens, q, p)
    h = block_acceptance(w, q, p)
    if not gamma:
        return finish_chain(draft_tokens, torch.zeros(b, dtype=torch.long, device=p.device), p, None, h, generator)
    u = torch.rand(b, gamma, dtype=torch.float64, generator=generator, device=p.device)
    idx = torch.arange(1, gamma + 1, device=p.device).expand(b, gamma)
    tau = torch.where(u <= h, idx, torch.zeros_like(idx)).max(-1).values
    at = torch.clamp(tau, max=gamma - 1)
    r = block_residual(w[rows, tau], p[rows, tau], q[rows, at])
    return finish_chain(draft_tokens, tau, p, r, h, generator)
