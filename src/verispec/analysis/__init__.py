"""Exact math, no sampling: induced distributions, acceptance, TV/KL, Lemmas 1-2, the Figure-4 simulation."""

from verispec.analysis.exact import (
    acceptance_probability,
    as_dist,
    cos_we_closed_form,
    induced_distribution,
    kl,
    lenience_closed_form,
    truncation_closed_form,
    tv,
)
from verispec.analysis.sequence import sequence_distribution
from verispec.analysis.truncation import Lemma1, allowed_set, kl_eagle, kl_sd, lemma1

__all__ = [
    "Lemma1",
    "acceptance_probability",
    "allowed_set",
    "as_dist",
    "cos_we_closed_form",
    "induced_distribution",
    "kl",
    "kl_eagle",
    "kl_sd",
    "lemma1",
    "sequence_distribution",
    "lenience_closed_form",
    "truncation_closed_form",
    "tv",
]
