"""High-level entry points: load an engine (kept in an explicit cache), or ``generate`` in one call."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from . import models
from .backends.hf import HFBackend
from .config import DEFAULT_TEMPERATURE, DRAFTERS, drafter_spec
from .drafters import BaseDrafter, HybridDrafter, ModelDrafter, NgramDrafter, TreeDrafter
from .engine import Engine, GenerationResult
from .processors import SamplingConfig
from .rules import Rule, get

__all__ = ["DRAFTERS", "ENGINES", "EngineCache", "build_drafter", "generate", "load_engine"]


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
        raise ValueError("a llama.cpp drafter needs a draft model")
    key = os.fspath(draft)
    if key in models.REGISTRY:
        path = models.gguf_path(key)
        if not path.is_file():
            raise models.ModelNotInstalledError(f"{path} missing: run `verispec models install {key}`")
    elif key.endswith(".gguf"):
        path = key
    else:
        raise ValueError("a llama.cpp drafter needs a registered draft name or a .gguf file")
    # one llama.cpp thread: its threads spin-wait on each other and stall when they share 2 cores with torch
    return LlamaCppBackend(path, n_threads=1 if threads is None else max(1, threads // 2), vocab_size=vocab_size)


def build_drafter(
    drafter: str,
    draft: str | os.PathLike[str] | None,
    target_tokenizer: object,
    target_config: object,
    dtype: str = "bfloat16",
    threads: int | None = None,
    tree: dict | None = None,
    device: str = "cpu",
) -> BaseDrafter | None:
    """The drafter named ``drafter`` (see :data:`verispec.config.DRAFTERS`) on the ``draft`` model.

    ``tree``: :class:`~verispec.drafters.TreeDrafter` options (depth, top_k, budget, width, sample).
    A draft whose vocabulary differs from the target's is refused with :class:`models.VocabularyMismatchError`.
    """
    spec = drafter_spec(drafter)
    if spec.uses_draft_model and draft is None:
        raise ValueError(f"drafter {drafter!r} needs a draft model")
    backend = None
    if spec.draft_backend == "hf":
        d_model, d_tok = models.load_model(draft, dtype=dtype, device=device)  # type: ignore[arg-type]
        models.check_same_vocab(target_tokenizer, d_tok, target_config, d_model.config)
        backend = HFBackend(d_model)
    elif spec.draft_backend == "llamacpp":
        backend = _llamacpp_backend(draft, target_config.vocab_size, threads)  # type: ignore[attr-defined]
    if drafter == "none":
        return None
    if drafter == "ngram":
        return NgramDrafter()
    if drafter == "tree":
        return TreeDrafter(backend, **(tree or {}))  # type: ignore[arg-type]
    chain = ModelDrafter(backend)  # type: ignore[arg-type]
    return HybridDrafter(chain) if drafter.startswith("ngram+") else chain


class EngineCache:
    """Loaded engines by (target, draft, drafter, dtype, threads, tree options): loading the pair takes
    seconds, so :func:`load_engine` and :func:`generate` reuse them. ``clear()`` frees them."""

    def __init__(self) -> None:
        self._engines: dict[tuple, Engine] = {}

    def get(self, key: tuple) -> Engine | None:
        return self._engines.get(key)

    def put(self, key: tuple, engine: Engine) -> None:
        self._engines[key] = engine

    def clear(self) -> None:
        self._engines.clear()

    def __len__(self) -> int:
        return len(self._engines)


#: the process-wide engine cache used by :func:`load_engine` (pass ``cache=False`` to bypass it)
ENGINES = EngineCache()


def load_engine(
    target: str | os.PathLike[str] = models.DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = models.DEFAULT_DRAFT,
    drafter: str = "model",
    dtype: str = "bfloat16",
    threads: int | None = None,
    cache: bool = True,
    tree: dict | None = None,
    device: str = "cpu",
) -> Engine:
    """Load target (and draft) by registered name or local HF directory into a reusable engine.

    ``drafter`` is one of :data:`verispec.config.DRAFTERS`: "model" (the draft model, chain), "tree" (token
    trees verified in one target forward with tree attention; ``tree`` holds the tree drafter's options),
    "llamacpp" (the draft's GGUF run by llama.cpp, about 4x cheaper per draft token on CPU; needs
    ``requirements-fast.txt``), "ngram" (prompt lookup), "ngram+model" / "ngram+llamacpp" (prompt lookup when
    the last tokens occurred before, else that draft) or "none" (target only). ``device``: where the
    transformers models run ("cpu", "cuda", "cuda:1", ...); verification always runs on the CPU in float64.
    """
    if device != "cpu" and not device.startswith("cuda") and device != "mps":
        raise ValueError(f"device must be 'cpu', 'cuda[:N]' or 'mps', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    drafter_spec(drafter)
    if threads:
        torch.set_num_threads(threads)
    key = (os.fspath(target), os.fspath(draft) if draft else None, drafter, dtype, threads,
           tuple(sorted((tree or {}).items())), device)
    if cache and (hit := ENGINES.get(key)) is not None:
        return hit
    t_model, tok = models.load_model(target, dtype=dtype, device=device)
    eos = _eos_ids(t_model, tok, os.fspath(target))
    draft_impl = build_drafter(drafter, draft, tok, t_model.config, dtype, threads, tree, device)
    engine = Engine(HFBackend(t_model), draft_impl, tok, eos)
    if cache:
        ENGINES.put(key, engine)
    return engine


def generate(
    prompt_or_ids: str | Sequence[int],
    *,
    target: str | os.PathLike[str] = models.DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = models.DEFAULT_DRAFT,
    drafter: str = "model",
    rule: str | Rule = "lossless",
    rule_params: dict | None = None,
    gamma: int | str | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
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
    return engine.generate(  # type: ignore[return-value]
        prompt_or_ids,
        rule=rule_obj,
        sampling=cfg,
        gamma=gamma,
        max_new_tokens=max_new_tokens,
        stop=stop,
        seed=seed,
        chat=chat,
    )

