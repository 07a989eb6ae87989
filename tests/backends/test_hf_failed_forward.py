"""HFBackend under bad input and failed forwards: a refused request or a forward that raises leaves every row's
cache exactly as it was, so the next round's logits equal a fresh forward pass (toy fp32 model)."""

from __future__ import annotations

import pytest
import torch

from verispec.backends.base import ScoreRequest
from verispec.backends.hf import HFBackend
from verispec.testing import tiny_qwen

V = 64
TOL = 1e-4  # fp32: a cached forward vs a plain full forward


@pytest.fixture(scope="module")
def model():
    return tiny_qwen(1, vocab_size=V, logit_scale=4.0, max_context=128)


@torch.no_grad()
def _fresh(model, ids: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits after ``ids`` then each prefix of the chain ``tokens``, by full forwards without a cache."""
    return model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 :].float()


def _check_rows(model, b: HFBackend, rows: list[int]) -> None:
    hists = [[3, 1, 4, 1, 5, 9], [2, 7, 1, 8]][: len(rows)]
    drafts = [[2, 6], [5]][: len(rows)]
    out = b.score([ScoreRequest(r, h, d) for r, h, d in zip(rows, hists, drafts, strict=True)])
    for o, h, d in zip(out, hists, drafts, strict=True):
        assert (o - _fresh(model, h, d)).abs().max() < TOL


@pytest.mark.parametrize("n_rows", [1, 2])  # 1: the plain causal fast path; 2: the masked batch
def test_out_of_vocab_history_token_is_refused_before_any_change(model, n_rows):
    b = HFBackend(model)
    rows = [b.add_row() for _ in range(n_rows)]
    _check_rows(model, b, rows)
    for r in rows:
        b.commit(r, [0])
    # an id outside the vocabulary anywhere in the fed history (not only the last), or negative
    for bad in ([3, 1, 4, V + 35, 1, 5], [3, -2, 4]):
        with pytest.raises(ValueError, match="out of the vocabulary"):
            b.score([ScoreRequest(rows[0], bad, [1])])
    _check_rows(model, b, rows)


def test_out_of_vocab_continuation_token_is_refused(model):
    b = HFBackend(model)
    rows = [b.add_row(), b.add_row()]
    b.score([ScoreRequest(rows[0], [3, 1, 4], [1, 5]), ScoreRequest(rows[1], [2, 7], [1])])
    with pytest.raises(ValueError, match="out of the vocabulary"):
        b.score([ScoreRequest(rows[0], None, [V], [1])])
    _check_rows(model, b, rows)


class _FailOnce(torch.nn.Module):
    """The model, whose next forward raises after its first decoder layer has written its KV."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.armed = model, False
        model.model.layers[1].register_forward_pre_hook(self._hook)

    def _hook(self, *_: object) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("injected failure")

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def forward(self, *args: object, **kw: object):
        return self.model(*args, **kw)


@pytest.mark.parametrize("n_rows", [1, 2])
def test_failed_forward_leaves_no_trace(n_rows):
    model = tiny_qwen(1, vocab_size=V, logit_scale=4.0, max_context=128)
    wrapped = _FailOnce(model)
    b = HFBackend(wrapped)  # type: ignore[arg-type]
    rows = [b.add_row() for _ in range(n_rows)]
    _check_rows(model, b, rows)
    for r in rows:
        b.commit(r, [0])
    wrapped.armed = True
    with pytest.raises(RuntimeError, match="injected"):
        b.score([ScoreRequest(r, b.cached_tokens(r) + [7], [8, 8]) for r in rows])
    # resume right after the committed history (no rollback that would cut a stale tail away)
    hists = [b.cached_tokens(r) + [6] for r in rows]
    out = b.score([ScoreRequest(r, h, [5]) for r, h in zip(rows, hists, strict=True)])
    for o, h in zip(out, hists, strict=True):
        assert (o - _fresh(model, h, [5])).abs().max() < TOL
    _check_rows(model, b, rows)
