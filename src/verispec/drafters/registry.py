"""Drafter names -> objects: the one factory, driven by the drafter's spec (:data:`verispec.defaults.DRAFTERS`:
which backend runs the draft model and what kind of proposal is built on it). The API and the toy engines of the
tests both build drafters here."""

from __future__ import annotations

from collections.abc import Callable

from verispec.backends.base import Backend
from verispec.defaults import drafter_spec
from verispec.drafters.base import BaseDrafter
from verispec.drafters.hybrid import HybridDrafter
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.drafters.tree import TreeDrafter

__all__ = ["make_drafter"]


def make_drafter(name: str, draft: Callable[[], Backend] | None = None, tree: dict | None = None,
                 p_min: float = 0.0) -> BaseDrafter | None:
    """The drafter ``name`` on the draft model that ``draft()`` loads (called only when the drafter uses one).

    ``tree``: :class:`~verispec.drafters.TreeDrafter` options (depth, top_k, budget, width, sample). ``p_min``:
    the confidence gate of a chain drafted by the draft model (:class:`~verispec.drafters.ModelDrafter`)."""
    spec = drafter_spec(name)
    if tree and not spec.proposes_trees:
        raise ValueError(f"tree options apply to a tree drafter, not {name!r}")
    if p_min and spec.kind not in ("chain", "hybrid"):
        raise ValueError(f"draft p_min gates a draft model's chain; drafter {name!r} has none")
    if spec.kind == "none":
        return None
    if spec.kind == "ngram":
        return NgramDrafter()
    if draft is None:
        raise ValueError(f"drafter {name!r} needs a draft model")
    backend = draft()
    if spec.kind == "tree":
        return TreeDrafter(backend, **(tree or {}))
    chain = ModelDrafter(backend, p_min=p_min)
    return HybridDrafter(chain) if spec.kind == "hybrid" else chain
