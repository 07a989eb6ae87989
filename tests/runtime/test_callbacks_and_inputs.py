"""The runtime on callbacks and bad input (toy engines, seconds): callbacks that raise cost no other request its
tokens or its on_done; prompt logprobs on a vocabulary smaller than ``top``; a one-prompt ``generate`` raises what
failed its start; bad prompts and sampling settings are refused with a ValueError naming them."""

from __future__ import annotations

import pytest

from verispec.backends.hf import HFBackend
from verispec.core.sampling import SamplingConfig
from verispec.drafters import ModelDrafter
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import Request
from verispec.testing import tiny_qwen, toy_engine

GREEDY = SamplingConfig(temperature=0)


def test_a_raising_token_callback_costs_no_other_handle_its_tokens():
    """Two rows, one token per round; the first row's on_tokens raises in the second round. The step re-raises,
    but the other row's handle and stream still get that round's token, and both finish with every token."""
    eng = toy_engine("model")
    sched = Scheduler(eng, max_batch=2)
    streamed: dict[int, list[int]] = {0: [], 1: []}

    def on_tokens(h, toks):
        streamed[h.id].extend(toks)
        if h.id == 0 and len(streamed[0]) == 2:
            raise RuntimeError("client went away")

    hs = [sched.submit(Request([1, 2, 3], sampling=GREEDY, gamma=0, max_new_tokens=4), on_tokens=on_tokens)
          for _ in range(2)]
    raised = 0
    while not sched.idle:
        try:
            sched.step()
        except RuntimeError:
            raised += 1
    assert raised == 1
    for h in hs:
        assert len(h.result.token_ids) == 4
        assert h.tokens == streamed[h.id] == h.result.token_ids, h.id


def test_a_raising_done_callback_skips_no_other_done_callback():
    eng = toy_engine("model")
    sched = Scheduler(eng, max_batch=3)
    done: list[int] = []

    def on_done(h):
        done.append(h.id)
        if h.id == 0:
            raise RuntimeError("boom")

    hs = [sched.submit(Request([1, 2, 3], sampling=GREEDY, gamma=1, max_new_tokens=2), on_done=on_done)
          for _ in range(3)]
    with pytest.raises(RuntimeError, match="boom"):
        sched.run()
    sched.run()
    assert sorted(done) == [h.id for h in hs] and all(h.done for h in hs)


def test_prompt_logprobs_on_a_vocabulary_smaller_than_top():
    """vocab 5, prompt_logprobs 20 (the schema's most): every token's alternatives are the 5 tokens, as for the
    generated tokens' logprobs, instead of a failed row."""
    target = tiny_qwen(11, vocab_size=5, logit_scale=8)
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(tiny_qwen(12, vocab_size=5))))
    out = eng.generate([1, 2, 3], sampling=GREEDY, gamma=2, max_new_tokens=3, prompt_logprobs=20, logprobs=20)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert [len(t.top) for t in out.prompt_logprobs] == [0, 5, 5]
    assert [len(t.top) for t in out.logprobs] == [5, 5, 5]


def test_one_prompt_generate_raises_what_failed_its_start(monkeypatch):
    eng = toy_engine("model", cache=False)

    def failing_start(req, prepared=None):
        raise RuntimeError("no cache row left")

    monkeypatch.setattr(eng, "start", failing_start)
    with pytest.raises(RuntimeError, match="no cache row left"):
        eng.generate([1, 2, 3], sampling=GREEDY, max_new_tokens=2)
    outs = eng.generate([[1, 2, 3], [4, 5]], sampling=GREEDY, max_new_tokens=2)  # a list: each fails alone
    assert [o.finish_reason for o in outs] == ["error", "error"]


@pytest.mark.parametrize("prompt", [[1.5, 2], [1, True], [1, "2"]])
def test_non_integer_prompt_ids_are_refused(prompt):
    eng = toy_engine("model")
    with pytest.raises(ValueError, match="prompt"):
        eng.generate(prompt, sampling=GREEDY, max_new_tokens=2)


def test_sampling_that_is_no_config_is_refused_naming_it():
    eng = toy_engine("model")
    with pytest.raises(ValueError, match="sampling must be a SamplingConfig"):
        eng.generate([1, 2, 3], sampling={"temperature": 0.5}, max_new_tokens=2)
