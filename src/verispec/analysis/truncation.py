"""Exact quantities of truncation sampling vs truncation-based verification (Lemmas 1 and 2 of the
lossy-verification paper)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.analysis.exact import as_dist
from verispec.core.rules.validate import check_delta, check_epsilon, check_p_base
from verispec.core.sampling import eta_mask, minp_mask, renormalize_on

__all__ = ["Lemma1", "allowed_set", "kl_eagle", "kl_sd", "lemma1"]


def allowed_set(p: torch.Tensor, strategy: str, param: float, delta: float | None = None) -> torch.Tensor:
    """A_Theta for ``strategy`` "minp" (p_base, Eq. 5) or "eta" (epsilon, delta, Eq. 6). The parameters are checked
    as the rules check them (ValueError naming the parameter): outside its range a set can be empty (p_base > 1),
    and p_Theta = p / Z_Theta(p) is then undefined."""
    if strategy == "minp":
        check_p_base(param)
        return minp_mask(p, param)
    if strategy == "eta":
        check_epsilon(param)
        check_delta(delta)
        return eta_mask(p, param, delta)
    raise ValueError(f"unknown truncation strategy {strategy!r} (use 'minp' or 'eta')")


@dataclass
class Lemma1:
    """Lemma 1 terms (each batched): the change in single-token acceptance caused by truncating p.

    ``direct`` = sum min(p_Theta, q) - sum min(p, q); ``gain`` = sum_{x in A} min{(q - p)+, (1/z - 1) p, p/z};
    ``loss`` = L_trunc = sum_{x not in A} min(p, q); ``net`` = gain - loss, which equals ``direct``.
    (The paper prints L_trunc inside the min; it is subtracted once, as its proof shows.)
    """

    direct: torch.Tensor
    gain: torch.Tensor
    loss: torch.Tensor

    @property
    def net(self) -> torch.Tensor:
        return self.gain - self.loss


def lemma1(p: object, q: object, allowed: torch.Tensor) -> Lemma1:
    """Lemma 1 of the lossy-verification paper, computed both directly and as gain minus loss."""
    p, q = as_dist(p), as_dist(q)
    pt = renormalize_on(p, allowed)
    direct = torch.minimum(pt, q).sum(-1) - torch.minimum(p, q).sum(-1)
    z = torch.where(allowed, p, torch.zeros_like(p)).sum(-1, keepdim=True)
    per_x = torch.minimum(torch.minimum(torch.clamp(q - p, min=0), (1 / z - 1) * p), p / z)
    gain = torch.where(allowed, per_x, torch.zeros_like(p)).sum(-1)
    loss = torch.where(allowed, torch.zeros_like(p), torch.minimum(p, q)).sum(-1)
    return Lemma1(direct=direct, gain=gain, loss=loss)


def kl_sd(p: object, q: object, allowed: torch.Tensor) -> torch.Tensor:
    """Lemma 2, standard SD: KL(q / Z(q) on A || p_Theta) = sum_A q/Z_q log(q Z_p / (Z_q p)).

    +inf when the draft has no mass on A (Eq. 13 is then undefined)."""
    p, q = as_dist(p), as_dist(q)
    zp = torch.where(allowed, p, torch.zeros_like(p)).sum(-1, keepdim=True)
    zq = torch.where(allowed, q, torch.zeros_like(q)).sum(-1, keepdim=True)
    use = allowed & (q > 0)
    safe = lambda t: torch.where(use, t, torch.ones_like(t))  # noqa: E731
    terms = torch.where(use, q / zq * torch.log(safe(q) * zp / (zq * safe(p))), torch.zeros_like(q))
    out = terms.sum(-1)
    return torch.where(zq.squeeze(-1) > 0, out, torch.full_like(out, float("inf")))


def kl_eagle(p: object, candidates: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Lemma 2, tree (EAGLE-3) verification: the position emits the first candidate x in A surely, a point
    mass whose KL to p_Theta is log(Z_Theta(p) / p(x)). ``candidates`` [..., D] are token ids in the order
    examined; +inf when no candidate lies in A (then the bonus from p_Theta is emitted and this formula does
    not apply)."""
    p = as_dist(p)
    zp = torch.where(allowed, p, torch.zeros_like(p)).sum(-1)
    in_set = allowed.gather(-1, candidates)
    first = torch.where(in_set.any(-1), in_set.long().argmax(-1), torch.zeros_like(zp, dtype=torch.long))
    x = candidates.gather(-1, first.unsqueeze(-1)).squeeze(-1)
    px = p.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    out = torch.log(zp / px)
    return torch.where(in_set.any(-1), out, torch.full_like(out, float("inf")))
