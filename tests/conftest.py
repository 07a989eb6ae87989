"""Shared test setup: one intra-op thread (tiny models are dominated by thread start-up on 2 cores), every core for
the tests of the real pair (a 1.5B fp32 forward is dominated by its matrix products), one fp32 load of the real
pair for every test that needs it (loading it costs tens of seconds), and one load of the pair on the fastest
backend installed for the tests that need a real pair but not transformers' exact fp32 decode."""

import pytest
import torch

from verispec.testing import REAL_THREADS

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _threads(request):
    """Every core for a test marked ``real`` (unless also marked ``one_thread``: it compares against numbers
    recorded with one), one thread for the rest."""
    marked = request.node.get_closest_marker("real") is not None
    torch.set_num_threads(REAL_THREADS if marked and request.node.get_closest_marker("one_thread") is None else 1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def real_engine_fp32():
    """The real Qwen2.5-Coder pair in fp32 with the default (transformers) drafter, loaded once per session;
    skips when the pair is not installed. Tests must not change its state between calls (each generate call
    allocates and frees its own rows)."""
    from verispec import load_engine
    from verispec.testing import skip_unless_real_pair

    skip_unless_real_pair()
    return load_engine(drafter="model", target_backend="hf", dtype="float32", cache=False)


@pytest.fixture(scope="session")
def real_engine_fast(request):
    """The real pair on the fastest backend installed, loaded once per session: llama.cpp target and draft (the
    GGUFs) where llama-cpp-python is installed, else :func:`real_engine_fp32`. For tests of what sits above the
    backends (the server, grammars, tool calls), which hold on any backend; equality with transformers' own decode
    is tested on :func:`real_engine_fp32`."""
    from verispec import load_engine, models
    from verispec.defaults import llamacpp_installed
    from verispec.testing import skip_unless_real_pair

    skip_unless_real_pair()
    if not llamacpp_installed() or not all(
            models.gguf_path(m).is_file() for m in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT)):
        return request.getfixturevalue("real_engine_fp32")
    return load_engine(drafter="llamacpp", target_backend="llamacpp", cache=False)


@pytest.fixture(scope="session")
def target_greedy(real_engine_fp32):
    """``target_greedy(ids, n)``: the real fp32 target's own greedy continuation of ``ids`` by transformers'
    ``generate`` (at most ``n`` tokens, stopping at an end token), computed once per prompt: a shorter request is
    the prefix of a longer one (greedy decoding is prefix-consistent), so tests that compare with the same prompt
    share one decode."""
    engine = real_engine_fp32
    eos = sorted(engine.eos_token_ids)
    done: dict[tuple[int, ...], tuple[int, list[int]]] = {}

    def run(ids, n: int) -> list[int]:
        key = tuple(ids)
        have = done.get(key)
        if have is None or (have[0] < n and len(have[1]) == have[0]):  # not run this far, and it did not stop
            with torch.inference_mode():
                out = engine.target.model.generate(
                    torch.tensor([list(ids)]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=eos[0],
                )[0, len(ids):].tolist()
            have = done[key] = (n, out)
        return have[1][:n]

    return run
