"""Structured output (response_format): the grammar constraint applied to p and q alike keeps lossless
verification exact for the constrained target (chi-square against an independent hand-written mask), greedy
decoding equals the constrained target's greedy decode for every drafter, and on the real pair every output
parses and validates against its JSON schema."""

from __future__ import annotations

import json

import pytest
import torch

from verispec.analysis import sequence_distribution
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig, process
from verispec.drafters import ModelDrafter, NgramDrafter
from verispec.drafters.tree import TreeDrafter
from verispec.runtime.engine import Engine
from verispec.testing import ToyTokenizer, chi_square_pvalue, tiny_qwen, toy_engine

V = 64  # the toy tokenizer's alphabet: a = 0, b = 1, c = 2, ..., "\n" = 63
REGEX = {"type": "regex", "regex": "(ab|ba|cc)[abc]"}
N_SEQ = 4000
ALPHA = 1e-4


def allowed_by_hand(prefix: tuple[int, ...]) -> list[int]:
    """The regex (ab|ba|cc)[abc] written out by hand: the oracle the grammar library is checked against."""
    a, b, c, end = 0, 1, 2, 63
    if len(prefix) == 0:
        return [a, b, c]
    if len(prefix) == 1:
        return {a: [b], b: [a], c: [c]}[prefix[0]]
    if len(prefix) == 2:
        return [a, b, c]
    return [end]


@pytest.fixture(scope="module")
def pair():
    return tiny_qwen(31, vocab_size=V, logit_scale=3), tiny_qwen(32, vocab_size=V, logit_scale=3)


def constrained_p(model, prompt: tuple[int, ...], cfg: SamplingConfig):
    """p'(. | prefix): the model's processed distribution restricted to the hand-written allowed set."""
    def fn(seq: tuple[int, ...]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([list(seq)])).logits[0, -1]
        mask = torch.full((V,), float("-inf"))
        mask[allowed_by_hand(seq[len(prompt):])] = 0.0
        return process(logits + mask, cfg)
    return fn


def engine(target, draft, kind: str = "model") -> Engine:
    drafters = {"model": lambda: ModelDrafter(HFBackend(draft)), "ngram": lambda: NgramDrafter(),
                "tree": lambda: TreeDrafter(HFBackend(draft), depth=3, top_k=2)}
    return Engine(HFBackend(target), drafters[kind](), ToyTokenizer(), ())


def test_grammar_masks_equal_the_hand_written_ones(pair):
    """The library's masks over every prefix of the regex equal the hand-written allowed sets."""
    target, draft = pair
    c = engine(target, draft).grammar.constraint(REGEX)
    for prefix in [(), (0,), (1,), (2,), (0, 1), (1, 0), (2, 2), (0, 1, 2)]:
        assert torch.nonzero(c.allowed(prefix)).flatten().tolist() == sorted(allowed_by_hand(prefix)), prefix
    assert c.allowed((0, 0)) is None and c.valid_prefix([0, 0, 1]) == 1 and c.valid_prefix([2, 2, 1, 63, 63]) == 5


def test_constrained_lossless_sampling_is_the_constrained_target_law(pair):
    """T = 1, lossless, gamma 3, model drafter: the 3-token continuations follow the constrained target's exact
    law. Chi-square, N = 4000 continuations, alpha = 1e-4; a sampled continuation outside the grammar has exact
    probability 0 and fails the test at once."""
    target, draft = pair
    cfg = SamplingConfig(temperature=1.0)
    prompt = (5, 9, 3)
    exact = sequence_distribution("lossless", constrained_p(target, prompt, cfg), None, 0, 3, prompt)
    assert len(exact) == 9
    eng = engine(target, draft)
    counts: dict[tuple[int, ...], int] = {}
    outs = eng.generate([list(prompt)] * N_SEQ, sampling=cfg, gamma=3, max_new_tokens=3, seed=list(range(N_SEQ)),
                        response_format=REGEX, batch_size=64)  # one seeded row per continuation, 64 at a time
    for out in outs:
        key = tuple(out.token_ids)
        assert exact.get(key, 0.0) > 0, f"sampled {key}, outside the grammar"
        counts[key] = counts.get(key, 0) + 1
    pvalue = chi_square_pvalue(counts, exact)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize("kind", ["model", "ngram", "tree"])
def test_constrained_greedy_equals_the_constrained_targets_greedy(pair, kind):
    """Greedy, every drafter (prompt lookup proposes tokens the grammar forbids: they are cut before
    verification): the output is the constrained target's own greedy decode, then only the end token."""
    target, draft = pair
    greedy = SamplingConfig(temperature=0)
    for prompt in [(0, 1, 2, 0, 1), (2, 2, 2), (1, 0, 1, 0, 1, 0)]:
        p = constrained_p(target, prompt, greedy)
        seq = prompt
        for _ in range(5):
            seq = seq + (int(p(seq).argmax()),)
        out = engine(target, draft, kind).generate(list(prompt), sampling=greedy, gamma=3, max_new_tokens=5,
                                                   response_format=REGEX)
        assert tuple(out.token_ids) == seq[len(prompt):] and out.token_ids[3:] == [63, 63]


def test_bad_response_formats_are_named(pair):
    target, draft = pair
    eng = engine(target, draft)
    with pytest.raises(ValueError, match="response_format.type must be one of"):
        eng.generate([1, 2], response_format={"type": "xml"}, max_new_tokens=2)
    with pytest.raises(ValueError, match="response_format: the grammar does not compile"):
        eng.generate([1, 2], response_format={"type": "regex", "regex": "(ab"}, max_new_tokens=2)
    with pytest.raises(ValueError, match="response_format"):
        eng.generate([1, 2], response_format={"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}},
                     max_new_tokens=2)
    with pytest.raises(ValueError, match="response_format.regex must be a string"):
        eng.generate([1, 2], response_format={"type": "regex"}, max_new_tokens=2)


def test_a_grammar_no_token_can_start_is_refused_and_one_that_dead_ends_fails_its_row_alone():
    """The toy tokenizer writes only letters, digits, space and newline: a grammar none of its tokens can start is
    a ValueError naming response_format before anything runs; one it can start but not go on with ("a<b": no
    token writes "<") fails its own row, finish_reason "error" naming the grammar, while the row batched with it
    decodes exactly as alone (greedy, gamma 3)."""
    eng, greedy = toy_engine("model", cache=False), SamplingConfig(temperature=0)
    with pytest.raises(ValueError, match="response_format: no text matches it"):
        eng.generate("hello", sampling=greedy, max_new_tokens=4, response_format={"type": "regex", "regex": "<"})
    alone = eng.generate("steady", sampling=greedy, max_new_tokens=12, gamma=3)
    good, bad = eng.generate(["steady", "hello"], sampling=greedy, max_new_tokens=12, gamma=3,
                             response_format=[None, {"type": "regex", "regex": "a<b"}])
    assert good.text == alone.text and good.finish_reason == "length"
    assert bad.finish_reason == "error" and ("grammar" in bad.error or "response_format" in bad.error), bad.error
    with pytest.raises((RuntimeError, ValueError), match="grammar|response_format"):
        eng.generate("hello", sampling=greedy, max_new_tokens=12, response_format={"type": "regex", "regex": "a<b"})


@pytest.mark.real
def test_real_pair_json_schema_output_parses_and_validates(real_engine_fast):
    """The real pair (on the fastest backend installed), greedy and sampled (lossless and a lossy rule), under a
    JSON schema: every output is JSON with the required keys and types."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "languages": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age", "languages"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    prompt = "Describe a fictional programmer as JSON with name, age and languages."
    runs = [(SamplingConfig(temperature=0), "lossless", 0), (SamplingConfig(temperature=0.8), "lossless", 1),
            (SamplingConfig(temperature=0.8), get("lenience", l=0.5), 2)]
    outs = real_engine_fast.generate([prompt] * len(runs), chat=True, sampling=[c for c, _, _ in runs],
                                     rule=[r for _, r, _ in runs], gamma=4, seed=[s for _, _, s in runs],
                                     max_new_tokens=96, response_format=fmt)  # the three as rows of one batch
    for out in outs:
        assert out.finish_reason == "stop", out.text
        obj = json.loads(out.text)
        assert set(obj) == {"name", "age", "languages"}
        assert isinstance(obj["name"], str) and isinstance(obj["age"], int)
        assert all(isinstance(x, str) for x in obj["languages"])
