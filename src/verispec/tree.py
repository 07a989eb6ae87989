"""Token trees: layout, tree attention, and the verification walk of Appendix H.1 (EAGLE-3 style).

A :class:`TokenTree` holds drafted nodes with the index of their parent (``-1`` for the root, the last
committed token; a parent always precedes its children). A node's children, in index order, are the ordered
candidate set C = (x(1), ..., x(D)) examined at the position after that node.

The target scores every node in ONE forward after its cached prefix: each node attends to the prefix and to
its ancestors (itself included), at position ``prefix_len - 1 + depth`` (:func:`tree_attention`).

:func:`verify_tree` walks from the root. At a node with target distribution p and p_Theta = rule.target(p):

* lossless rules (``lossless``, and the truncation baselines ``minp-sampling`` / ``eta-sampling``) run the
  recursive rejection sampling of multi-candidate SD: p~ <- p_Theta; candidate i is accepted with
  min(1, p~(x_i) / q_i(x_i)); after a rejection p~ <- norm([p~ - q_i]+). For a token-only (greedy) candidate
  set q_i is one-hot, so this is H.1 Eq. 26: accept with p~(x_i), zero-and-renormalize (Lemma 3(i)). For a
  sampled candidate set (children drawn one after another without replacement from q),
  q_1 = q and q_{i+1} = q_i with x_i removed, renormalized; equally lossless. When no child is accepted the
  bonus is drawn from the current p~ (after the removals), so the position emits p_Theta exactly.
* truncation-based rules (``spec-cascade`` Eq. 27, ``typical`` Eq. 28) use h(x) = 1[x in A_Theta] with A
  computed on p_Theta, examined in order with p~ = p_Theta throughout (Lemma 3(ii)); if none is accepted the
  path ends with a bonus token from p_Theta. Eq. 28 also writes typical acceptance as
  min{p_Theta(x) / tau, 1}, tau = min(eps, delta e^{-H(p_Theta)}), which is fractional where
  0 < p_Theta(x) < tau (the form Lemma 3(ii) uses); ``typical="ratio"`` selects that reading.

Every uniform is float64; every token is drawn with :func:`verispec.verify.sample_categorical`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from .processors import eta_threshold
from .rules import Rule, TruncationRule
from .rules.truncation import Typical
from .verify import sample_categorical

__all__ = [
    "TokenTree",
    "TreeVerifyResult",
    "ancestor_matrix",
    "check_tree_rule",
    "candidate_q",
    "select_child",
    "tree_acceptance",
    "tree_attention",
    "tree_depths",
    "verify_tree",
]

TypicalMode = Literal["indicator", "ratio"]


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node (children of the root have depth 1); parents must precede their children."""
    depths: list[int] = []
    for i, par in enumerate(parents):
        if par >= i or par < -1:
            raise ValueError(f"node {i} has parent {par}: a parent must be -1 (root) or an earlier node")
        depths.append(1 if par < 0 else depths[par] + 1)
    return depths


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """Boolean [n, n]: entry (i, j) is True when node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    tree_depths(parents)  # validates
    for i, par in enumerate(parents):
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    return anc


def tree_attention(
    parents: Sequence[int],
    num_new: int,
    past_linear: int,
    feed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive 4-D attention mask and position ids for one forward over ``feed`` linear tokens then the last
    ``num_new`` nodes of a tree, after a cache of ``past_linear`` linear tokens and the tree's earlier nodes.

    ``parents`` covers every tree node (the earlier ones, already cached after the linear part, then the new
    ones). Key columns: the linear tokens (cached, then fed), then the tree nodes in index order. A fed linear
    token attends causally; a node attends to every linear token and to its ancestors and itself. Positions:
    linear token t sits at t; a node at depth d at ``past_linear + feed - 1 + d``. Returns
    (mask [1, 1, feed + num_new, past_linear + feed + len(parents)], position_ids [1, feed + num_new]).
    """
    n_all = len(parents)
    n_old = n_all - num_new
    if num_new < 0 or n_old < 0:
        raise ValueError(f"num_new={num_new} does not fit a tree of {n_all} nodes")
    if feed and n_old:
        raise ValueError("linear tokens cannot be fed while tree nodes are cached")
    linear = past_linear + feed
    if linear < 1:
        raise ValueError("a tree needs at least one linear token (its root) before it")
    depths = tree_depths(parents)
    anc = ancestor_matrix(parents)
    allowed = torch.zeros(feed + num_new, linear + n_all, dtype=torch.bool)
    if feed:
        allowed[:feed, :linear] = torch.ones(feed, linear, dtype=torch.bool).tril(past_linear)
    allowed[feed:, :linear] = True
    allowed[feed:, linear:] = anc[n_old:]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    pos = list(range(past_linear, linear)) + [linear - 1 + d for d in depths[n_old:]]
    return mask[None, None].to(device), torch.tensor([pos], dtype=torch.long, device=device)


@dataclass
class TokenTree:
    """Drafted nodes: ``tokens[i]`` with parent ``parents[i]`` (-1 = the root, i.e. the last committed token).

    ``child_q`` maps a node (or -1) to the draft distribution q [V] its children were drawn from, one after
    another without replacement, in index order (sampled mode); a node without an entry has a token-only
    (greedy) candidate set. ``meta`` is free for drafters (e.g. which nodes have KV in the draft cache).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    child_q: dict[int, torch.Tensor] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        self.depths = tree_depths(self.parents)
        self._children: dict[int, list[int]] = {}
        for i, par in enumerate(self.parents):
            self._children.setdefault(par, []).append(i)
        for node, kids in self._children.items():
            toks = [self.tokens[k] for k in kids]
            if len(set(toks)) != len(toks):
                raise ValueError(f"node {node} has repeated candidate tokens {toks}")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in the order they are examined."""
        return list(self._children.get(node, []))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to ``node`` (empty for the root)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.path_to(node)]


# -- the walk ------------------------------------------------------------------------------------------------
def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=generator))


def candidate_q(q: torch.Tensor, candidates: Sequence[int]) -> list[torch.Tensor]:
    """q_1..q_D of candidates drawn without replacement from q: q_{i+1} = q_i with x_i removed, renormalized."""
    out = []
    cur = q.to(torch.float64)
    for x in candidates:
        if not cur[x] > 0:
            raise ValueError(f"candidate {x} has zero draft probability: it cannot have been drawn from q")
        out.append(cur)
        nxt = cur.clone()
        nxt[x] = 0.0
        mass = nxt.sum()
        cur = nxt / mass if mass > 0 else nxt
    return out


def tree_acceptance(rule: TruncationRule, p_theta: torch.Tensor, typical: TypicalMode = "indicator") -> torch.Tensor:
    """h over the vocabulary for a truncation-based rule in a tree (H.1 Eq. 27-28), from p_Theta.

    Indicator 1[x in A_Theta(p_Theta)]; with ``typical="ratio"`` typical acceptance uses
    min{p_Theta(x) / tau, 1}, tau = min(eps, delta e^{-H(p_Theta)}) (delta = eps unless set).
    """
    if typical not in ("indicator", "ratio"):
        raise ValueError(f"typical must be 'indicator' or 'ratio', got {typical!r}")
    if typical == "ratio" and isinstance(rule, Typical):
        tau = eta_threshold(p_theta, rule.epsilon, rule.delta)
        return torch.clamp(p_theta / tau, max=1.0)
    return rule.allowed(p_theta).to(p_theta.dtype)


def check_tree_rule(rule: Rule) -> None:
    if not (rule.lossless or isinstance(rule, TruncationRule)):
        raise ValueError(
            f"tree verification supports lossless rules (lossless, minp-sampling, eta-sampling) and truncation-based "
            f"rules (spec-cascade, typical), not {rule.name!r}"
        )


def select_child(
    rule: Rule,
    p: torch.Tensor,
    candidates: Sequence[int],
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    typical: TypicalMode = "indicator",
) -> tuple[int | None, int]:
    """One position of the walk: returns (index of the accepted candidate, its token) or (None, bonus token).

    ``p`` [V] is the target's processed distribution at this position; ``candidates`` the ordered candidate
    tokens; ``q`` the draft distribution they were drawn from without replacement (None: token-only).
    """
    check_tree_rule(rule)
    pt = rule.target(p.to(torch.float64))
    if rule.lossless:
        cur = pt
        qs = candidate_q(q, candidates) if q is not None else [None] * len(candidates)
        for i, (x, qi) in enumerate(zip(candidates, qs, strict=True)):
            h = min(1.0, float(cur[x])) if qi is None else min(1.0, float(cur[x] / qi[x]))
            if _uniform(generator) < h:
                return i, int(x)
            if qi is None:
                res = cur.clone()
                res[x] = 0.0
            else:
                res = torch.clamp(cur - qi, min=0.0)
            mass = res.sum()
            if mass > 0:  # no mass only when h == 1, where a rejection cannot happen
                cur = res / mass
        return None, int(sample_categorical(cur, generator))
    h = tree_acceptance(rule, pt, typical)  # type: ignore[arg-type]
    for i, x in enumerate(candidates):
        if _uniform(generator) < float(h[x]):
            return i, int(x)
    return None, int(sample_categorical(pt, generator))


@dataclass
class TreeVerifyResult:
    """``path``: accepted node indices root-down; ``tokens``: their tokens then the bonus token; ``rejected``:
    True when the walk ended at a node that had children (all rejected), False when it ended at a leaf."""

    path: list[int]
    tokens: list[int]
    rejected: bool

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def bonus(self) -> int:
        return self.tokens[-1]


def verify_tree(
    rule: Rule,
    tree: TokenTree,
    dist_fn: Callable[[int], torch.Tensor],
    generator: torch.Generator | None = None,
    typical: TypicalMode = "indicator",
) -> TreeVerifyResult:
    """Walk the tree from the root (H.1). ``dist_fn(node)`` returns the target's processed distribution p [V]
    at the position after ``node`` (-1: after the root); it is called only for the nodes the walk reaches."""
    check_tree_rule(rule)
    node, path = -1, []
    while True:
        kids = tree.children(node)
        i, tok = select_child(
            rule, dist_fn(node), [tree.tokens[k] for k in kids], tree.child_q.get(node), generator, typical
        )
        if i is None:
            return TreeVerifyResult(path, [tree.tokens[n] for n in path] + [tok], rejected=bool(kids))
        node = kids[i]
        path.append(node)
