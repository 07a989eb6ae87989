"""Token trees: layout, tree attention, and the verification walk of Appendix H.1 (EAGLE-3 style).

A :class:`TokenTree` holds drafted nodes with the index of their parent (``-1`` for the root, the last
committed token; a parent always precedes its children). A node's children, in index order, are the ordered
candidate set C = (x(1), ..., x(D)) examined at the position after that node.

The target scores every node in ONE forward after its cached prefix: each node attends to the prefix and to
its ancestors (itself included), at position ``prefix_len - 1 + depth`` (:func:`tree_attention`).

:func:`verify_tree` walks from the root. Each position is ONE step, :class:`PositionWalk`, written only with
the rule's ``target``, ``acceptance`` and ``correction`` (through ``rule.tree_verifier()`` and its
``tree_rejection``), and shared with the exact analysis (:func:`verispec.analysis.tree.position_law`): a new rule
needs no edit here. At a node with target distribution p, p~_1 = rule.target(p), v = rule.tree_verifier():

* candidate x_i (q_i: the draft distribution it was drawn from; one-hot for a token-only candidate set) is
  accepted with h_i = v.acceptance(p~_i, q_i)(x_i), and with 0 when q_i(x_i) = 0;
* after a rejection, v.tree_rejection = "residual" sets p~_{i+1} = v.correction(p~_i, q_i); "keep" leaves it;
* when every candidate is rejected the bonus token is drawn from p~_{D+1}.

For the lossless rules (``lossless``; the truncation baselines verify p_Theta with plain lossless SD) this is
the recursive rejection sampling of multi-candidate SD: accept with min(1, p~(x_i) / q_i(x_i)), then
p~ <- norm([p~ - q_i]+). With a token-only candidate set q_i is one-hot: H.1 Eq. 26, accept with p~(x_i),
zero-and-renormalize (Lemma 3(i)). For a sampled set (children drawn one after another without replacement
from q) q_1 = q and q_{i+1} = q_i with x_i removed, renormalized; equally lossless. Either way the position
emits p_Theta exactly. Truncation-based rules (``spec-cascade`` Eq. 27, ``typical`` Eq. 28) apply their own h
to p_Theta (the distribution the tree verifier scores), keep p~ = p_Theta throughout and draw the bonus from it
(Lemma 3(ii)); typical's ``acceptance`` parameter picks Eq. 28's indicator or its fractional reading
min{p_Theta(x) / tau, 1}, tau = min(eps, delta e^{-H(p_Theta)}).

Every uniform is float64; every token is drawn with :func:`verispec.core.verify.chain.sample_categorical`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from verispec.core.rules import Rule, TruncationRule
from verispec.core.verify.chain import as_float64, check_distribution, sample_categorical

__all__ = [
    "PositionWalk",
    "TokenTree",
    "TreeVerifyResult",
    "ancestor_matrix",
    "check_tree_rule",
    "candidate_q",
    "select_child",
    "tree_acceptance",
    "tree_depths",
    "tree_path",
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


def tree_path(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's first child down to ``node`` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


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
        return tree_path(self.parents, node)

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


def _with_typical(rule: Rule, typical: TypicalMode | None) -> Rule:
    """Backward compatibility of the old ``typical=`` keyword: it sets the rule's ``acceptance`` parameter."""
    if typical is None:
        return rule
    if typical not in ("indicator", "ratio"):
        raise ValueError(f"typical must be 'indicator' or 'ratio', got {typical!r}")
    if "acceptance_form" not in rule.param_names or rule.acceptance_form == typical:  # type: ignore[attr-defined]
        return rule
    warnings.warn("typical= is deprecated: build the rule with acceptance='ratio' (or 'indicator') instead",
                  DeprecationWarning, stacklevel=3)
    return dataclasses.replace(rule, acceptance_form=typical)  # type: ignore[type-var]


def tree_acceptance(rule: TruncationRule, p_theta: torch.Tensor, typical: TypicalMode | None = None) -> torch.Tensor:
    """h over the vocabulary that the tree walk uses for a truncation-based rule (H.1 Eq. 27-28): the rule's
    own acceptance applied to p_Theta. For typical, ``acceptance="indicator"`` gives 1[x in A_Theta(p_Theta)],
    ``"ratio"`` min{p_Theta(x) / tau, 1}, tau = min(eps, delta e^{-H(p_Theta)}); ``typical=`` overrides it
    (deprecated)."""
    rule = _with_typical(rule, typical)  # type: ignore[assignment]
    return rule.tree_verifier().acceptance(p_theta, p_theta)


def check_tree_rule(rule: Rule) -> None:
    """Raise ValueError unless the rule has a tree walk (``rule.tree_verifier().tree_rejection`` is set)."""
    if rule.tree_verifier().tree_rejection not in ("residual", "keep"):
        raise ValueError(
            f"tree verification supports lossless rules (lossless, minp-sampling, eta-sampling) and truncation-based "
            f"rules (spec-cascade, typical), not {rule.name!r}"
        )


class PositionWalk:
    """One position of the walk (App. H.1; see the module docstring), lazily.

    Iterating yields h_1, h_2, ...: the acceptance probability of candidate i given that candidates 1..i-1 were
    rejected; asking for h_{i+1} means candidate i was rejected (the residual is only computed then).
    :attr:`bonus` is the current p~: after the whole iteration, the bonus distribution of an all-reject position.
    The sampler (:func:`select_child`) and the exact analysis (:func:`verispec.analysis.tree.position_law`) both
    consume this one object.
    """

    def __init__(self, rule: Rule, p: torch.Tensor, candidates: Sequence[int], q: torch.Tensor | None = None):
        check_tree_rule(rule)
        check_distribution("p", p)
        if q is not None:
            check_distribution("q", q)
        self.rule = rule
        self.verifier = rule.tree_verifier()
        self.candidates = [int(x) for x in candidates]
        vocab = p.shape[-1]
        if (bad := next((x for x in self.candidates if not 0 <= x < vocab), None)) is not None:
            raise ValueError(f"candidate token id {bad} is outside the vocabulary [0, {vocab})")
        self.bonus = rule.target(as_float64(p))
        q = as_float64(q) if q is not None else None
        self._qs = candidate_q(q, self.candidates) if q is not None else None

    def _q(self, i: int) -> torch.Tensor:
        if self._qs is not None:
            return self._qs[i]
        onehot = torch.zeros_like(self.bonus)
        onehot[self.candidates[i]] = 1.0
        return onehot

    def __iter__(self) -> Iterator[float]:
        for i, x in enumerate(self.candidates):
            qi = self._q(i)
            h = float(self.verifier.acceptance(self.bonus, qi)[x]) if qi[x] > 0 else 0.0
            yield h
            if self.verifier.tree_rejection == "residual":
                self.bonus = self.verifier.correction(self.bonus, qi)


def select_child(
    rule: Rule,
    p: torch.Tensor,
    candidates: Sequence[int],
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    typical: TypicalMode | None = None,
) -> tuple[int | None, int]:
    """One position of the walk: returns (index of the accepted candidate, its token) or (None, bonus token).

    ``p`` [V] is the target's processed distribution at this position; ``candidates`` the ordered candidate
    tokens; ``q`` the draft distribution they were drawn from without replacement (None: token-only).
    ``typical`` is the deprecated form of typical's ``acceptance`` parameter.
    """
    walk = PositionWalk(_with_typical(rule, typical), p, candidates, q)
    for i, h in enumerate(walk):
        if _uniform(generator) < h:
            return i, walk.candidates[i]
    return None, int(sample_categorical(walk.bonus, generator))


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
    typical: TypicalMode | None = None,
) -> TreeVerifyResult:
    """Walk the tree from the root (H.1). ``dist_fn(node)`` returns the target's processed distribution p [V]
    at the position after ``node`` (-1: after the root); it is called only for the nodes the walk reaches.
    ``typical`` is the deprecated form of typical's ``acceptance`` parameter."""
    rule = _with_typical(rule, typical)
    check_tree_rule(rule)
    node, path = -1, []
    while True:
        kids = tree.children(node)
        i, tok = select_child(rule, dist_fn(node), [tree.tokens[k] for k in kids], tree.child_q.get(node), generator)
        if i is None:
            return TreeVerifyResult(path, [tree.tokens[n] for n in path] + [tok], rejected=bool(kids))
        node = kids[i]
        path.append(node)
