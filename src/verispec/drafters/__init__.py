"""Drafters: each proposes candidate tokens and returns the exact q they were drawn from (or None)."""

from .base import Draft, DraftContext, Drafter
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter, ngram_lookup

__all__ = ["Draft", "DraftContext", "Drafter", "HybridDrafter", "ModelDrafter", "NgramDrafter", "ngram_lookup"]
