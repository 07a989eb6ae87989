"""High-level entry points: load an engine (kept in an explicit cache), or ``generate`` in one call."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from verispec import models
from verispec.backends.base import Backend, common_prefix_len
from verispec.backends.hf import HFBackend
from verispec.backends.isolated import RowIsolated
from verispec.backends.llamacpp import LlamaCppBackend
from verispec.core.rules import Rule, get
from verispec.core.sampling import SamplingConfig
from verispec.defaults import (
    AUTO,
    DEFAULT_CONTEXT,
    DEFAULT_DRAFT,
    DEFAULT_DTYPE,
    DEFAULT_TARGET,
    DRAFTERS,
    DTYPES,
    check_pairing,
    drafter_spec,
    resolve_backends,
)
from verispec.drafters import BaseDrafter
from verispec.drafters.registry import make_drafter
from verispec.options import OPTIONS, check_all
from verispec.options import options as schema_options
from verispec.runtime.engine import Engine
from verispec.runtime.types import GenerationResult

__all__ = ["DRAFTERS", "ENGINES", "EngineCache", "build_drafter", "generate", "load_engine", "load_llamacpp_target"]


def _eos_ids(model: torch.nn.Module, tokenizer: object, name: str) -> list[int]:
    ids: set[int] = set(models.EOS_TOKEN_IDS) if name in models.REGISTRY else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _llamacpp_backend(draft: str | os.PathLike[str] | None, vocab_size: int, threads: int | None,
                      n_threads: int | None = None, isolate_rows: bool = False, max_rows: int = 8) -> object:
    """A llama.cpp backend on the draft's GGUF (a registered name's assembled GGUF, or a ``.gguf`` path).

    ``n_threads`` (llama.cpp threads) defaults to half of ``threads`` (at least 1): with a transformers target,
    llama.cpp's threads spin-wait on each other and stall when they share the cores with torch's.
    """

    if draft is None:
        raise ValueError("a llama.cpp drafter needs a draft model")
    path, _ = _gguf_of(draft, "drafter")
    if n_threads is None:
        n_threads = 1 if threads is None else max(1, threads // 2)
    if isolate_rows:
        return _isolated_llamacpp(path, n_threads=n_threads, vocab_size=vocab_size)
    return LlamaCppBackend(path, n_threads=n_threads, vocab_size=vocab_size, max_rows=max_rows)


def _isolated_llamacpp(path: str, **kw: Any) -> RowIsolated:
    """A llama.cpp model with every row on a context of its own (one sequence, no prefix cache), all contexts on
    the first one's weights: :class:`~verispec.backends.isolated.RowIsolated`."""
    first: list[LlamaCppBackend] = []

    def make() -> LlamaCppBackend:
        backend = LlamaCppBackend(path, max_rows=1, prefix_cache=False, share_model=first[0] if first else None,
                                  **kw)
        if not first:
            first.append(backend)
        return backend

    return RowIsolated(make)


#: a text with code, unicode, CJK and emoji on which a llama.cpp target's ids must equal the HF tokenizer's
_TOKENIZER_PROBE = "def f(x):\n    return x ** 2  # Grüße, 你好, 😀 <|im_end|>\n\tprint('done')"


def _gguf_of(name: str | os.PathLike[str], role: str) -> tuple[str, bool]:
    """(GGUF path, registered?) of a registered model name or a ``.gguf`` file."""
    key = os.fspath(name)
    if key in models.REGISTRY:
        path = models.gguf_path(key)
        if not path.is_file():
            raise models.ModelNotInstalledError(f"{path} missing: run `verispec models install {key}`")
        # a partial or corrupted GGUF is rebuilt or refused, never handed to llama.cpp
        path = models.checked_gguf(key, progress=lambda m: print(m, file=sys.stderr, flush=True))
        return os.fspath(path), True
    if key.endswith(".gguf"):
        if not os.path.isfile(key):
            raise FileNotFoundError(f"GGUF file not found: {key}")
        return key, False
    raise ValueError(f"a llama.cpp {role} needs a registered model name or a .gguf file, got {key!r}")


def load_llamacpp_target(
    target: str | os.PathLike[str] = DEFAULT_TARGET,
    threads: int | None = None,
    n_ctx: int = DEFAULT_CONTEXT,
    max_rows: int = 8,
    isolate_rows: bool = False,
) -> tuple[object, object, object, list[int]]:
    """The target's GGUF in llama.cpp: ``(backend, HF tokenizer, config with vocab_size, eos ids)``.

    ``target``: a registered name (its assembled GGUF; tokenizer, config and eos from its converted HF
    directory) or a ``.gguf`` path (tokenizer read from the GGUF by transformers; eos from llama.cpp's vocab).
    The HF tokenizer must give llama.cpp's ids on a probe text, else :class:`models.VocabularyMismatchError`.
    """
    from types import SimpleNamespace


    path, registered = _gguf_of(target, "target")
    if registered:
        from transformers import AutoConfig, GenerationConfig

        hf_dir = models.resolve(target)
        tok = models.load_tokenizer(target)
        config = AutoConfig.from_pretrained(hf_dir)
        try:
            gen = GenerationConfig.from_pretrained(hf_dir)
        except OSError:
            gen = None
        vocab = int(config.vocab_size)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
        gen, vocab = None, 0
    vocab_size = None if vocab <= 0 else vocab
    if isolate_rows:
        backend: Any = _isolated_llamacpp(path, n_ctx=n_ctx, n_threads=threads or 2, vocab_size=vocab_size)
    else:
        backend = LlamaCppBackend(path, n_ctx=n_ctx, n_threads=threads or 2, max_rows=max_rows, vocab_size=vocab_size)
    if registered and backend.n_vocab > vocab:
        raise models.VocabularyMismatchError(f"{path} has {backend.n_vocab} tokens, its HF config {vocab}")
    hf_ids = list(tok(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
    lc_ids = backend.tokenize(_TOKENIZER_PROBE)
    if hf_ids != lc_ids:
        raise models.VocabularyMismatchError(
            f"the HF tokenizer and llama.cpp tokenize a probe text differently ({len(hf_ids)} vs {len(lc_ids)} ids, "
            f"first difference at {common_prefix_len(hf_ids, lc_ids)}): {path} does not match its tokenizer")
    if not registered:
        config = SimpleNamespace(vocab_size=backend.vocab_size)
    eos = _eos_ids(SimpleNamespace(generation_config=gen), tok, os.fspath(target))
    eos = sorted(set(eos) | set(backend.eos_ids()))
    return backend, tok, config, eos


def build_drafter(
    drafter: str,
    draft: str | os.PathLike[str] | None,
    target_tokenizer: object,
    target_config: object,
    dtype: str = DEFAULT_DTYPE,
    threads: int | None = None,
    tree: dict | None = None,
    device: str = "cpu",
    draft_threads: int | None = None,
    isolate_rows: bool = False,
    p_min: float = 0.0,
    max_rows: int = 8,
) -> BaseDrafter | None:
    """The drafter named ``drafter`` (see :data:`verispec.defaults.DRAFTERS`) on the ``draft`` model.

    ``tree``: :class:`~verispec.drafters.TreeDrafter` options (depth, top_k, budget, width, sample).
    ``draft_threads``: llama.cpp threads of a llama.cpp draft (default: half of ``threads``, see
    :func:`_llamacpp_backend`; with a llama.cpp target, which runs between the drafts, all of them).
    ``isolate_rows``: every row of the draft model on a backend of its own (:class:`RowIsolated`). ``p_min``: the
    draft model's confidence gate (:class:`~verispec.drafters.ModelDrafter`; 0: off). ``max_rows``: rows a
    llama.cpp draft holds at once (its sequences).
    A draft whose vocabulary differs from the target's is refused with :class:`models.VocabularyMismatchError`.
    """
    spec = drafter_spec(drafter)
    if spec.uses_draft_model and draft is None:
        raise ValueError(f"drafter {drafter!r} needs a draft model")

    def load_draft() -> Backend:
        if spec.draft_backend == "llamacpp":
            return _llamacpp_backend(draft, target_config.vocab_size, threads,  # type: ignore[attr-defined]
                                     draft_threads, isolate_rows, max_rows)
        d_model, d_tok = models.load_model(draft, dtype=dtype, device=device)  # type: ignore[arg-type]
        models.check_same_vocab(target_tokenizer, d_tok, target_config, d_model.config)
        return RowIsolated(lambda: HFBackend(d_model)) if isolate_rows else HFBackend(d_model)

    return make_drafter(drafter, load_draft if spec.uses_draft_model else None, tree, p_min)


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


def _model_key(name: str | os.PathLike[str]) -> tuple[str, str]:
    """What a model argument loads, for the engine cache: a registered name in the model cache it is read from,
    a path made absolute (a relative one names another model once the working directory changes)."""
    key = os.fspath(name)
    if key in models.REGISTRY:
        return key, os.fspath(models.cache_dir())
    return "path", os.path.abspath(os.path.expanduser(key))


def _check_engine_args(dtype: object, threads: object, draft_p_min: object, max_rows: object,
                       deterministic: object = False) -> None:
    """ValueError naming the argument for a value :func:`load_engine` cannot honour, before anything loads (the
    front doors' ranges: ``--dtype``, ``--threads``, ``--draft-p-min``, ``--max-batch``; ``deterministic`` a bool,
    so that the text "no" from a model-argument string is not read as true)."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be true or false, got {deterministic!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be an integer >= 1 (or None: every core), got {threads!r}")
    if not isinstance(draft_p_min, int | float) or isinstance(draft_p_min, bool) or not 0 <= draft_p_min <= 1:
        raise ValueError(f"draft_p_min must be a number in [0, 1], got {draft_p_min!r}")
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
        raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")


def load_engine(
    target: str | os.PathLike[str] = DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = DEFAULT_DRAFT,
    drafter: str = AUTO,
    dtype: str = DEFAULT_DTYPE,
    threads: int | None = None,
    cache: bool = True,
    tree: dict | None = None,
    device: str = "cpu",
    target_backend: str = AUTO,
    deterministic: bool = False,
    draft_p_min: float = 0.0,
    max_rows: int = 8,
) -> Engine:
    """Load target (and draft) by registered name or local HF directory into a reusable engine.

    ``drafter`` and ``target_backend``: "auto" (the default, as :func:`generate`'s) resolves both as
    :func:`~verispec.defaults.resolve_backends` does (llama.cpp when it is installed and the device is the CPU,
    else transformers). ``drafter`` is one of :data:`verispec.defaults.DRAFTERS`: "model" (the draft model, chain),
    "tree" (token
    trees verified in one target forward with tree attention; ``tree`` holds the tree drafter's options),
    "llamacpp" (the draft's GGUF run by llama.cpp, about 4x cheaper per draft token on CPU; needs
    ``requirements-fast.txt``), "ngram" (prompt lookup), "ngram+model" / "ngram+llamacpp" (prompt lookup when
    the last tokens occurred before, else that draft) or "none" (target only). ``device``: where the
    transformers models run ("cpu", "cuda", "cuda:1", ...); verification always runs on the CPU in float64.

    ``target_backend``: "hf" (transformers: exact fp32 equality with transformers) or "llamacpp"
    (the target's GGUF run by llama.cpp, see :func:`load_llamacpp_target`; ``dtype`` then applies to an HF draft
    only). With a llama.cpp target the drafters' ``gamma="auto"`` uses its block-cost curve
    (:meth:`~verispec.backends.llamacpp.LlamaCppBackend.block_cost`) and falls back to gamma 0 when drafting
    does not pay. Token trees need tree attention, which the llama.cpp backend lacks: "tree" is refused.

    ``deterministic``: every row of the target and of the draft model on a backend of its own
    (:class:`~verispec.backends.isolated.RowIsolated`), so a seeded request's tokens do not depend on what else
    shares its batch (nor on a prefix cached by an earlier request); it gives up batched forwards.
    ``draft_p_min``: the draft model stops a row's chain at the first position where its top probability is below
    this (llama.cpp's ``--draft-p-min``; lossless; 0: off). ``max_rows``: the most rows (requests decoded together)
    a llama.cpp target or draft holds at once, its sequences, whose KV cells are allocated up front
    (:attr:`Engine.max_rows`; transformers backends have no such limit).

    A value it cannot honour (a dtype outside :data:`~verispec.defaults.DTYPES`, threads or max_rows below 1,
    draft_p_min outside [0, 1], a device torch does not see) is refused by name before anything loads. Engines are
    cached by what they load: a draft the drafter does not load is left out of the key, a path is made absolute.
    """
    if not isinstance(device, str) or (device != "cpu" and not device.startswith("cuda") and device != "mps"):
        raise ValueError(f"device must be 'cpu', 'cuda[:N]' or 'mps', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' asked for, but torch sees no MPS device")
    _check_engine_args(dtype, threads, draft_p_min, max_rows, deterministic)
    target_backend, drafter = resolve_backends(target_backend, drafter, device)
    check_pairing(drafter, target_backend)
    if not drafter_spec(drafter).uses_draft_model:
        draft = None  # not loaded: the engine is the same whatever draft was named
    if threads:
        torch.set_num_threads(threads)
    key = (_model_key(target), _model_key(draft) if draft else None, drafter, dtype, threads,
           tuple(sorted((tree or {}).items())), device, target_backend, bool(deterministic), float(draft_p_min),
           int(max_rows))
    if cache and (hit := ENGINES.get(key)) is not None:
        return hit
    if target_backend == "llamacpp":
        backend, tok, config, eos = load_llamacpp_target(target, threads, max_rows=max_rows,
                                                         isolate_rows=deterministic)
        draft_impl = build_drafter(drafter, draft, tok, config, dtype, threads, tree, device,
                                   draft_threads=threads or 2, isolate_rows=deterministic, p_min=draft_p_min,
                                   max_rows=max_rows)
        if draft_impl is not None:
            draft_impl.target_cost = backend.block_cost  # type: ignore[attr-defined]
        engine = Engine(backend, draft_impl, tok, eos)  # type: ignore[arg-type]
    else:
        t_model, tok = models.load_model(target, dtype=dtype, device=device)
        eos = _eos_ids(t_model, tok, os.fspath(target))
        draft_impl = build_drafter(drafter, draft, tok, t_model.config, dtype, threads, tree, device,
                                   isolate_rows=deterministic, p_min=draft_p_min, max_rows=max_rows)
        target_impl = RowIsolated(lambda: HFBackend(t_model)) if deterministic else HFBackend(t_model)
        engine = Engine(target_impl, draft_impl, tok, eos)  # type: ignore[arg-type]
    if cache:
        ENGINES.put(key, engine)
    return engine


def generate(
    prompt_or_ids: str | Sequence[int],
    *,
    target: str | os.PathLike[str] = DEFAULT_TARGET,
    draft: str | os.PathLike[str] | None = DEFAULT_DRAFT,
    drafter: str = AUTO,
    rule_params: dict | None = None,
    dtype: str = DEFAULT_DTYPE,
    target_backend: str = AUTO,
    draft_p_min: float = 0.0,
    **options: Any,
) -> GenerationResult:
    """Speculative generation in one call; models are loaded once and kept for later calls.

    ``drafter`` and ``target_backend``: "auto" (the default) runs both on llama.cpp when it is installed, else
    on transformers (:func:`~verispec.defaults.resolve_backends`). ``rule_params``: the parameters of ``rule``.
    ``draft_p_min``: a draft model's chain stops where its top probability falls below this (lossless; 0: off).
    Every other keyword is an option of the request schema (:data:`verispec.options.OPTIONS`, listed in this
    function's signature with its default): ``rule``, ``verifier``, ``gamma`` (the draft length, tree depth, or
    "auto": the adaptive schedule, which drafts only while it pays here; pass a constant for a seed-reproducible
    sampled run), ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``eta``, the penalties, ``logit_bias``,
    ``logprobs`` / ``logprobs_mode``, ``response_format`` (structured output), ``budget`` (a divergence budget:
    ``{"tv": 0.05}`` and / or ``{"tv_total": B}``), ``max_new_tokens``, ``stop``, ``seed``, ``chat``, ...

    Returns text, token ids, finish_reason ("stop" or "length") and metrics (BE, tokens/round, timings).
    """
    values = check_all(options)
    sampling = SamplingConfig.of({o.name: values.pop(o.name) for o in schema_options("sampling")
                                  if o.name in values})
    rule = values.pop("rule", OPTIONS["rule"].default)
    if isinstance(rule, Rule) and rule_params:
        raise ValueError(f"rule_params apply to a rule given by name; {rule.describe()} carries its own")
    rule_obj = rule if isinstance(rule, Rule) else get(rule, **(rule_params or {}))
    target_backend, drafter = resolve_backends(target_backend, drafter)
    engine = load_engine(target, draft if drafter_spec(drafter).uses_draft_model else None, drafter, dtype,
                         target_backend=target_backend, draft_p_min=draft_p_min)
    return engine.generate(prompt_or_ids, rule=rule_obj, sampling=sampling, **values)  # type: ignore[return-value]


def _signature() -> inspect.Signature:
    """:func:`generate`'s signature: its own parameters, then every option of the request schema."""
    own = [p for p in inspect.signature(generate).parameters.values() if p.kind is not p.VAR_KEYWORD]
    schema = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default)
              for o in schema_options()]
    return inspect.Signature(own + schema, return_annotation=GenerationResult)


generate.__signature__ = _signature()  # type: ignore[attr-defined]
