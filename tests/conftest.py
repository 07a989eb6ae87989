"""Shared test setup: one intra-op thread (tiny models are dominated by thread start-up on 2 cores), and one fp32
load of the real pair for every test that needs it (loading it costs tens of seconds)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def real_engine_fp32():
    """The real Qwen2.5-Coder pair in fp32 with the default (transformers) drafter, loaded once per session;
    skips when the pair is not installed. Tests must not change its state between calls (each generate call
    allocates and frees its own rows)."""
    from verispec import load_engine
    from verispec.testing import skip_unless_real_pair

    skip_unless_real_pair()
    return load_engine(dtype="float32", cache=False)
