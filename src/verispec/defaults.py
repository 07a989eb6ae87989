"""One source of truth for the names and defaults that the API, the CLI, sweeps and the server share."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHAT_MAX_NEW_TOKENS", "DEFAULT_BATCH_SIZE", "DEFAULT_DRAFT", "DEFAULT_DRAFTER", "DEFAULT_DTYPE",
           "DEFAULT_GAMMA", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_TARGET", "DEFAULT_TARGET_BACKEND", "DEFAULT_TEMPERATURE",
           "DRAFTERS", "DTYPES", "PAPER_SEEDS", "SWEEP_MAX_NEW_TOKENS", "TARGET_BACKENDS", "DrafterSpec",
           "TargetBackendSpec", "check_pairing", "drafter_spec", "target_backend"]

#: the default real pair (registered names; :mod:`verispec.models` installs them)
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
#: sampling temperature when none is given (the paper's experiments use 0.7): SamplingConfig, Engine.generate, the
#: API, the CLI, the server and sweeps all read it from here
DEFAULT_TEMPERATURE = 0.7
#: chain draft length when none is given
DEFAULT_GAMMA = 5
#: new tokens of a request that names none (``generate --chat`` allows a complete answer; sweeps their own)
DEFAULT_MAX_NEW_TOKENS = 128
CHAT_MAX_NEW_TOKENS = 512
SWEEP_MAX_NEW_TOKENS = 256
#: the paper's three seeds (sweeps)
PAPER_SEEDS = (0, 1, 2)
#: precision of the transformers models
DTYPES = ("bfloat16", "float32", "float16")
DEFAULT_DTYPE = "bfloat16"
DEFAULT_DRAFTER = "model"
DEFAULT_TARGET_BACKEND = "hf"
#: units (or requests) decoded at once as rows of one batch by the harness (docs/results/batching.md)
DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter choice, as data: ``draft_backend`` is what runs the draft model ("hf", "llamacpp" or None: no model);
    ``kind`` is what the drafter builds on it ("chain": the draft model's chain, "tree": a token tree, "ngram":
    prompt lookup, "hybrid": prompt lookup else the draft model's chain, "none": no drafter)."""

    name: str
    draft_backend: str | None
    kind: str
    help: str

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_backend is not None

    @property
    def proposes_trees(self) -> bool:
        """Proposals are token trees: the target needs tree attention, and only tree-safe rules apply."""
        return self.kind == "tree"


DRAFTERS: dict[str, DrafterSpec] = {
    s.name: s
    for s in (
        DrafterSpec("model", "hf", "chain", "chain from the draft model (transformers)"),
        DrafterSpec("llamacpp", "llamacpp", "chain",
                    "chain from the same draft run by llama.cpp (requirements-fast.txt)"),
        DrafterSpec("tree", "hf", "tree", "token tree from the draft model, verified in one target forward (App. H.1)"),
        DrafterSpec("ngram", None, "ngram", "prompt lookup, no draft model"),
        DrafterSpec("ngram+model", "hf", "hybrid", "prompt lookup when it matches, else the draft model"),
        DrafterSpec("ngram+llamacpp", "llamacpp", "hybrid", "prompt lookup when it matches, else the llama.cpp draft"),
        DrafterSpec("none", None, "none", "target only, through the same loop"),
    )
}


def drafter_spec(name: str) -> DrafterSpec:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}") from None


@dataclass(frozen=True)
class TargetBackendSpec:
    """What can run the target, as data: ``tree_attention`` says whether it scores token trees in one forward."""

    name: str
    help: str
    tree_attention: bool


#: what can run the target: "hf" (transformers; exact fp32 equality with transformers) or "llamacpp" (the
#: target's GGUF run by llama.cpp via llama-cpp-python, requirements-fast.txt; raw logits, verispec samples)
TARGET_BACKENDS: dict[str, TargetBackendSpec] = {
    s.name: s
    for s in (
        TargetBackendSpec("hf", "transformers (default; exact fp32 equality with transformers)", True),
        TargetBackendSpec("llamacpp", "the target's GGUF run by llama.cpp (requirements-fast.txt); fastest on a CPU",
                          False),
    )
}


def target_backend(name: str) -> str:
    """Validate a target backend name (see :data:`TARGET_BACKENDS`)."""
    if name not in TARGET_BACKENDS:
        raise ValueError(f"unknown target backend {name!r}; choose one of {', '.join(TARGET_BACKENDS)}")
    return name


def check_pairing(drafter: str, target_backend_name: str) -> None:
    """ValueError for an unknown drafter or target backend, or when the drafter's proposals need a capability the
    target backend lacks (trees on llama.cpp)."""
    spec, backend = drafter_spec(drafter), TARGET_BACKENDS[target_backend(target_backend_name)]
    if spec.proposes_trees and not backend.tree_attention:
        raise ValueError(f"drafter {drafter!r} needs a target with tree attention; target_backend "
                         f"{target_backend_name!r} has none")
