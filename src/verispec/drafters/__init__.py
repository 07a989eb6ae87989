"""Drafters: each proposes a chain or a token tree per row and returns the exact q it drew from (or None)."""

from verispec.drafters.base import BaseDrafter, Drafter, DraftRequest, Proposal
from verispec.drafters.hybrid import HybridDrafter
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter, ngram_lookup
from verispec.drafters.tree import TreeDrafter

__all__ = [
    "BaseDrafter",
    "DraftRequest",
    "Drafter",
    "HybridDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "TreeDrafter",
    "ngram_lookup",
]
