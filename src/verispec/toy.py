"""Toy models: a tiny random Qwen2 target / draft pair (fp32, built from a config, no download) with a character
tokenizer, run by the same engine as the real pair. A documented model kind of the library: the sweeps'
``target = "toy"``, dry runs, the certification of the vLLM plug-in against exact laws and the tests use it; its
numbers mean nothing about any real model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verispec.api import EngineCache
from verispec.backends.hf import HFBackend
from verispec.backends.isolated import RowIsolated
from verispec.defaults import TOY_ALPHABET
from verispec.drafters.registry import make_drafter
from verispec.runtime.engine import Engine

__all__ = ["TOY_ENGINES", "ToyTokenizer", "tiny_qwen", "toy_engine"]


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


class ToyTokenizer:
    """A character tokenizer over a 64-symbol alphabet, with a trivial chat template (for tiny models)."""

    alphabet = TOY_ALPHABET

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


#: the toy engines built so far
TOY_ENGINES = EngineCache()
