"""One source of truth for the names and defaults that the API, the CLI, sweeps and the server share."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_GAMMA", "DEFAULT_TEMPERATURE", "DRAFTERS", "TARGET_BACKENDS", "DrafterSpec", "drafter_spec",
           "target_backend"]

#: sampling temperature when none is given (the paper's experiments use 0.7)
DEFAULT_TEMPERATURE = 0.7
#: chain draft length when none is given
DEFAULT_GAMMA = 5


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter choice: ``draft_backend`` is what runs the draft model ("hf", "llamacpp" or None: no model)."""

    name: str
    draft_backend: str | None
    help: str

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_backend is not None


DRAFTERS: dict[str, DrafterSpec] = {
    s.name: s
    for s in (
        DrafterSpec("model", "hf", "chain from the draft model (transformers)"),
        DrafterSpec("llamacpp", "llamacpp", "chain from the same draft run by llama.cpp (requirements-fast.txt)"),
        DrafterSpec("tree", "hf", "token tree from the draft model, verified in one target forward (App. H.1)"),
        DrafterSpec("ngram", None, "prompt lookup, no draft model"),
        DrafterSpec("ngram+model", "hf", "prompt lookup when it matches, else the draft model"),
        DrafterSpec("ngram+llamacpp", "llamacpp", "prompt lookup when it matches, else the llama.cpp draft"),
        DrafterSpec("none", None, "target only, through the same loop"),
    )
}


def drafter_spec(name: str) -> DrafterSpec:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}") from None


#: what can run the target: "hf" (transformers; exact fp32 equality with transformers) or "llamacpp" (the
#: target's GGUF run by llama.cpp via llama-cpp-python, requirements-fast.txt; raw logits, verispec samples)
TARGET_BACKENDS: dict[str, str] = {
    "hf": "transformers (default; exact fp32 equality with transformers)",
    "llamacpp": "the target's GGUF run by llama.cpp (requirements-fast.txt); fastest on a CPU",
}


def target_backend(name: str) -> str:
    """Validate a target backend name (see :data:`TARGET_BACKENDS`)."""
    if name not in TARGET_BACKENDS:
        raise ValueError(f"unknown target backend {name!r}; choose one of {', '.join(TARGET_BACKENDS)}")
    return name
