"""Drafters: each proposes a chain or a token tree per row and returns the exact q it drew from (or None)."""

from .base import BaseDrafter, Drafter, DraftRequest, Proposal
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter, ngram_lookup
from .tree import TreeDrafter

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
