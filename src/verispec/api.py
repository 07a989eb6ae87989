"""High-level entry points: load an engine once (cached), or ``generate`` in one call."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from . import models
from .backends.hf import HFBackend
from .drafters import HybridDrafter, ModelDrafter, NgramDrafter
from .engine import GenerationResult, SpeculativeEngine
from .processors import SamplingConfig
from .rules import Rule, get

__all__ = ["DRAFTERS", "generate", "load_engine"]

DRAFTERS = ("model", "llamacpp", "ngram", "ngram+model", "ngram+llamacpp", "tree", "none")
_ENGINES: dict[tuple, SpeculativeEngine] = {}


def _eos_ids(model: torch.nn.Module, tokenizer: object, name: str) -> list[int]:
    ids: set[int] = set(models.EOS_TOKEN_IDS) if name in models.REGISTRY else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _llamacpp_backend(draft: str | os.PathLike[str] | None, vocab_size: int, threads: int | None) -> object:
    """A llama.cpp backend on the draft's GGUF (a registered name's assembled GGUF, or a ``.gguf`` path)."""
    from .backends.llamacpp import LlamaCppBackend

    if draft is None:
        raise ValueError("drafter 'llamacpp' needs a draft model")
    key = os.fspath(draft)
    if key in models.REGISTRY:
        path = models.gguf_path(key)
        if not path.is_file():
            raise models.ModelNotInstalledError(f"{path} missing: run `verispec models install {key}`")
    elif key.endswith(".gguf"):
        path = key
    else:
        raise ValueError("drafter 'llamacpp' needs a registered draft name or a .gguf file")
    # one llama.cpp thread: its threads spin-wait on each other and stall when they share 2 cores with torch
    return LlamaCppBackend(path, n_threads=1 if threads is None else max(1, threads // 2), vocab_size=vocab_size)


def load_engine(
    target: str | os.PathLike[str] = models.DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = models.DEFAULT_DRAFT,
    drafter: str = "model",
    dtype: str = "bfloat16",
    threads: int | None = None,
    cache: bool = True,
) -> SpeculativeEngine:
    """Load target (and draft) by registered name or local HF directory into a reusable engine.

    ``drafter``: "model" (the draft model, chain), "tree" (the draft model, token trees verified in one target
    forward with tree attention; a :class:`~verispec.tree_engine.TreeEngine`), "llamacpp" (the draft's GGUF run
    by llama.cpp, about 4x cheaper per draft token on CPU; needs ``requirements-fast.txt``), "ngram" (prompt
    lookup, no draft model), "ngram+model" / "ngram+llamacpp" (prompt lookup when the last tokens occurred
    before, else that draft; :class:`~verispec.drafters.HybridDrafter`) or "none" (target only).
    A draft whose vocabulary differs from the target's is refused with :class:`models.VocabularyMismatchError`.
    """
    if drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {drafter!r}; choose one of {', '.join(DRAFTERS)}")
    if threads:
        torch.set_num_threads(threads)
    key = (os.fspath(target), os.fspath(draft) if draft else None, drafter, dtype)
    if cache and key in _ENGINES:
        return _ENGINES[key]
    t_model, tok = models.load_model(target, dtype=dtype)
    draft_impl = None
    eos = _eos_ids(t_model, tok, os.fspath(target))
    if drafter in ("model", "tree", "ngram+model"):
        if draft is None:
            raise ValueError(f"drafter {drafter!r} needs a draft model")
        d_model, d_tok = models.load_model(draft, dtype=dtype)
        models.check_same_vocab(tok, d_tok, t_model.config, d_model.config)
        draft_impl = ModelDrafter(HFBackend(d_model))
    elif drafter in ("llamacpp", "ngram+llamacpp"):
        draft_impl = ModelDrafter(_llamacpp_backend(draft, t_model.config.vocab_size, threads))
    elif drafter == "ngram":
        draft_impl = NgramDrafter()
    if drafter.startswith("ngram+"):
        draft_impl = HybridDrafter(draft_impl)
    engine = SpeculativeEngine(HFBackend(t_model), draft_impl, tok, eos)
    if drafter == "tree":
        from .tree_engine import TreeEngine

        engine = TreeEngine.from_engine(engine)
    if cache:
        _ENGINES[key] = engine
    return engine


def generate(
    prompt_or_ids: str | Sequence[int],
    *,
    target: str | os.PathLike[str] = models.DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = models.DEFAULT_DRAFT,
    drafter: str = "model",
    rule: str | Rule = "lossless",
    rule_params: dict | None = None,
    gamma: int | str = 5,
    temperature: float = 1.0,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    eta: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    max_new_tokens: int = 128,
    stop: Sequence[str] = (),
    seed: int = 0,
    chat: bool = False,
    dtype: str = "bfloat16",
) -> GenerationResult:
    """Speculative generation in one call; models are loaded once and kept for later calls.

    Returns text, token ids, finish_reason ("stop" or "length") and metrics (BE, tokens/round, timings).
    """
    cfg = SamplingConfig(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        eta=eta,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
    )
    rule_obj = rule if isinstance(rule, Rule) else get(rule, **(rule_params or {}))
    engine = load_engine(target, draft, drafter, dtype)
    return engine.generate(
        prompt_or_ids,
        rule=rule_obj,
        sampling=cfg,
        gamma=gamma,
        max_new_tokens=max_new_tokens,
        stop=stop,
        seed=seed,
        chat=chat,
    )
