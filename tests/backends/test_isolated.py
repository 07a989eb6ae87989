"""Row isolation (``deterministic``): a row's logits and tokens do not depend on what shares its batch.

A real model in bf16 (the 0.5B: what is checked is the wrapper, not the model) is where batching moves numbers (a
batched forward changes a row's logits; the test checks that it does); under :class:`RowIsolated` the row's logits are
bit-identical alone and in any batch, after a rollback, and on a backend reused from an earlier row. The sweep test runs
a small real-pair grid (llama.cpp) three ways (batch size 1, batch size 4, two shards with a resume) and requires every
unit's tokens to be identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from verispec.backends.base import ScoreRequest
from verispec.backends.hf import HFBackend
from verispec.backends.isolated import RowIsolated
from verispec.eval import run as runner
from verispec.eval.grid import SweepConfig, parse_config
from verispec.testing import skip_unless_real_pair, tiny_qwen

G = torch.Generator().manual_seed(0)
HIST = [torch.randint(100, 5000, (n,), generator=G).tolist() for n in (10, 20, 6, 14)]
DRAFTS = [torch.randint(100, 5000, (k,), generator=G).tolist() for k in (5, 3, 5, 1)]


def _alone_and_batched(make) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Row 0's calls (a proposal, a commit of one node, then a rescore from its history: a rollback) on a backend
    alone, and the same calls with three other rows of other lengths in every score call. (A row's numbers may
    depend on its own call pattern, e.g. which tokens a forward feeds together; that pattern is the row's own.)"""

    def run(n_rows: int) -> list[torch.Tensor]:
        b = make()
        rows = [b.add_row() for _ in range(n_rows)]
        first = [ScoreRequest(rows[0], HIST[0], [7, 8, 9])]
        b.score(first + [ScoreRequest(r, h, [5]) for r, h in zip(rows[1:], HIST[1:], strict=False)])
        b.commit(rows[0], [0])
        for r in rows[1:]:
            b.commit(r, [])
        return b.score([ScoreRequest(r, h, d) for r, h, d in zip(rows, HIST, DRAFTS, strict=False)])

    return run(1)[0], run(len(HIST))


@pytest.fixture(scope="module")
def bf16_target():
    skip_unless_real_pair()
    from verispec import models

    model, _ = models.load_model("qwen2.5-coder-0.5b-instruct", dtype="bfloat16")
    return model


@pytest.mark.real
def test_real_bf16_target_isolated_rows_are_bit_identical(bf16_target):
    alone, batch = _alone_and_batched(lambda: RowIsolated(lambda: HFBackend(bf16_target)))
    assert torch.equal(alone, batch[0])
    plain_alone, plain_batch = _alone_and_batched(lambda: HFBackend(bf16_target))
    assert not torch.equal(plain_alone, plain_batch[0])  # without isolation the batch moves the row's numbers


@pytest.mark.real
def test_real_llamacpp_target_isolated_rows_are_bit_identical():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    skip_unless_real_pair()
    from verispec import models
    from verispec.api import _isolated_llamacpp

    path = str(models.gguf_path("qwen2.5-coder-0.5b-instruct"))  # the wrapper is checked, not the model
    shared: list = []

    def make() -> RowIsolated:
        iso = _isolated_llamacpp(path, n_threads=1, n_ctx=256)
        shared.append(iso)
        return iso

    alone, batch = _alone_and_batched(make)
    assert torch.equal(alone, batch[0])
    assert all(iso.name == "llamacpp-isolated" for iso in shared)


def test_a_reused_backend_computes_as_a_fresh_one():
    """Backends return to a pool when their row ends and are reset: a later row on the same backend computes
    exactly what it computes on a fresh one (no cache slots, no prefix of the earlier row)."""
    model = tiny_qwen(1, vocab_size=64, logit_scale=4.0)
    iso = RowIsolated(lambda: HFBackend(model))
    r = iso.add_row()
    iso.score([ScoreRequest(r, [1, 2, 3, 4, 5], [6, 7])])
    iso.commit(r, [0])
    iso.remove_row(r)
    r2 = iso.add_row()
    reused = iso.score([ScoreRequest(r2, [1, 2, 3, 9], [6])])[0]
    fresh = RowIsolated(lambda: HFBackend(model))
    assert torch.equal(reused, fresh.score([ScoreRequest(fresh.add_row(), [1, 2, 3, 9], [6])])[0])
    assert iso.cached_tokens(r2) == [1, 2, 3, 9] and iso.num_rows == 1


def test_contract_errors_and_call_count():
    iso = RowIsolated(lambda: HFBackend(tiny_qwen(1, vocab_size=64)))
    a, b = iso.add_row(), iso.add_row()
    iso.score([ScoreRequest(a, [1, 2]), ScoreRequest(b, [3, 4, 5], [6])])
    assert iso.forward_calls == 1  # one call per round, as a batched backend counts it
    with pytest.raises(ValueError, match="appears twice"):
        iso.score([ScoreRequest(a, [1, 2]), ScoreRequest(a, [1, 2])])
    with pytest.raises(ValueError, match="row 99 does not exist"):
        iso.score([ScoreRequest(99, [1])])
    assert iso.forward_calls == 1  # nothing ran


# ---------------------------------------------------------------------------------------------- sweeps


def _cfg(**top) -> SweepConfig:
    return parse_config({"name": "t", "seeds": [0], "tasks": [{"name": "toy", "limit": 1}],
                         "methods": [{"rule": "lossless"}], "models": {"target": "toy"}, **top})


def test_sweep_key_is_parsed_recorded_and_compared_on_resume(tmp_path):
    assert _cfg().deterministic is False and "deterministic" not in _cfg().settings()
    cfg = _cfg(deterministic=True)
    assert cfg.settings()["deterministic"] is True
    assert SweepConfig.from_json(cfg.to_json()) == cfg
    old = _cfg().to_json()
    old.pop("deterministic")  # a config.json written before the key existed ran batched
    assert SweepConfig.from_json(old).deterministic is False
    with pytest.raises(ValueError, match="deterministic must be true or false"):
        _cfg(deterministic="yes")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(old))
    runner._check_settings(run_dir, _cfg())
    with pytest.raises(ValueError, match="deterministic False vs True"):
        runner._check_settings(run_dir, cfg)


def test_toy_sweep_rows_run_isolated():
    engine = runner.default_engine_factory(_cfg(deterministic=True))
    assert isinstance(engine.target, RowIsolated)


def _tokens(run_dir: Path) -> dict[str, list[int]]:
    out = {}
    for f in sorted(run_dir.glob("results*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["key"] not in out
            out[rec["key"]] = rec["token_ids"]
    return out


@pytest.mark.real
def test_real_pair_sweep_is_identical_at_batch_1_batch_4_and_in_shards(tmp_path):
    """4 units (2 GSM8K questions x 2 seeds, lossless, T = 0.7, 12 new tokens: at least two rounds of gamma 5;
    llama.cpp target and draft, each row on contexts of its own): every unit's tokens are the same run at batch
    size 1, at batch size 4, and as 2 shards of which one stops after one unit and is resumed. (The transformers
    target's isolated rows are checked bit for bit above; a sweep on it costs minutes of bf16 on a CPU without
    native bf16.)"""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    skip_unless_real_pair()
    cfg = parse_config({"name": "det", "seeds": [0, 1], "temperature": 0.7, "gamma": 5, "max_new_tokens": 12,
                        "deterministic": True, "tasks": [{"name": "gsm", "limit": 2}],
                        "methods": [{"rule": "lossless"}],
                        "models": {"target_backend": "llamacpp", "drafter": "llamacpp", "threads": 2}})
    runs = {}
    for name, kw in (("b1", {"batch_size": 1}), ("b4", {"batch_size": 4})):
        runner.run_sweep(cfg, tmp_path / name, progress=False, **kw)
        runs[name] = _tokens(tmp_path / name)
    shards = tmp_path / "shards"
    runner.run_sweep(cfg, shards, progress=False, shard=(0, 2), max_units=1)
    runner.run_sweep(cfg, shards, progress=False, shard=(1, 2))
    runner.run_sweep(cfg, shards, progress=False, shard=(0, 2))  # the resume
    runs["shards"] = _tokens(shards)
    assert len(runs["b1"]) == 4
    assert runs["b1"] == runs["b4"] == runs["shards"]
