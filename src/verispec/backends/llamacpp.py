"""llama.cpp backend (via ``llama-cpp-python``'s low-level C API): a GGUF model with an exactly truncatable KV cache.

Same face as :class:`~verispec.backends.hf.HFBackend` (``tokens``, ``vocab_size``, ``max_context``,
``forward_calls``, ``extend``, ``truncate``, ``reset``, ``sync``), so it can serve as a
:class:`~verispec.drafters.ModelDrafter` backend. It returns raw next-token logits (no sampling inside
llama.cpp): verispec applies its own processors to them and samples itself.

C calls used: ``llama_decode`` with a ``llama_batch`` whose ``logits`` flags mark the last ``num_logits``
positions, ``llama_get_logits_ith`` to read each of them, and ``llama_memory_seq_rm`` (``llama_get_memory``)
to drop cache entries past a position (exact rollback; a pure-attention model such as Qwen2 keeps one KV cell
per token, so removal is exact).

Numerics: llama.cpp computes in the GGUF's quantized weights (e.g. Q4_K_M), so its logits are close to, not
equal to, those of the dequantized HF model. Scoring a block of k tokens in one ``llama_decode`` and scoring
them one at a time give slightly different floats (different matmul kernels / accumulation order); both are
deterministic for the same batch shapes.

Vocabulary padding: some GGUF conversions carry fewer token rows than the HF config's ``vocab_size`` (HF pads
the embedding to a multiple of 64/128; e.g. 151665 real tokens vs 151936). The Qwen2.5-Coder GGUFs used by
verispec already carry all 151936 rows, so no padding happens for them. Pass ``vocab_size`` (the target's
vocabulary) to pad each returned row with ``-inf`` up to it: padded ids then get probability 0 under any
processor, exactly like unused rows that are never sampled. ``vocab_size`` smaller than llama.cpp's
``n_vocab`` is refused.

Threads: llama.cpp synchronises its threads with a spinning barrier after every graph node (~800 per token for
the 0.5B model). On an idle 2-core machine ``n_threads=2`` is fastest (~21 ms/token vs ~31 ms with 1), but when
other processes also want the cores a descheduled thread stalls every barrier for a scheduler time slice: we
measured 0.1-4 s per token with 2 threads vs a steady 31-50 ms with 1 on a shared machine. Use
``n_threads=1`` where the CPU is shared (or oversubscribed by the target's own threads).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

from .base import SyncMixin

__all__ = ["LlamaCppBackend", "llama_cpp_available"]

try:  # optional dependency: requirements-fast.txt
    import llama_cpp as _llama
except ImportError:  # pragma: no cover - depends on the environment
    _llama = None

_BACKEND_INITIALISED = False


def llama_cpp_available() -> bool:
    """Whether the ``llama_cpp`` binding (llama-cpp-python) is importable."""
    return _llama is not None


def _init_backend() -> None:
    global _BACKEND_INITIALISED
    if not _BACKEND_INITIALISED:
        _llama.llama_backend_init()
        _BACKEND_INITIALISED = True


def _silence_logs() -> None:
    """Quiet llama.cpp's log (model-loading chatter) to errors only, unless VERISPEC_LLAMA_LOG is set."""
    if os.environ.get("VERISPEC_LLAMA_LOG"):
        return
    try:  # llama-cpp-python routes the C log through this callback; it prints what the logger's level allows
        from llama_cpp import _logger

        _logger.set_verbose(False)
    except Exception:  # pragma: no cover - logger layout differs between versions
        pass


class LlamaCppBackend(SyncMixin):
    """Scores blocks of tokens against a llama.cpp KV cache (sequence 0) and truncates it exactly.

    ``tokens`` lists the tokens whose KV is in the cache, as in :class:`~verispec.backends.hf.HFBackend`.
    ``n_ctx`` is the KV capacity (``max_context``); ``n_batch`` the most tokens per ``llama_decode`` (longer
    extends are split into several calls, counted once in ``forward_calls``).
    """

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        n_ctx: int = 4096,
        n_threads: int = 2,
        vocab_size: int | None = None,
        n_batch: int = 512,
    ) -> None:
        if _llama is None:
            raise ImportError("LlamaCppBackend needs llama-cpp-python: pip install -r requirements-fast.txt")
        path = os.fspath(gguf_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path}")
        _silence_logs()
        _init_backend()
        self.gguf_path = path
        mparams = _llama.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_mmap = True
        self._model = _llama.llama_model_load_from_file(path.encode(), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp failed to load {path}")
        self._vocab = _llama.llama_model_get_vocab(self._model)
        self.n_vocab = int(_llama.llama_vocab_n_tokens(self._vocab))
        self.vocab_size = int(vocab_size) if vocab_size is not None else self.n_vocab
        if self.vocab_size < self.n_vocab:
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than the model's n_vocab {self.n_vocab}")
        self.n_batch = int(n_batch)
        cparams = _llama.llama_context_default_params()
        cparams.n_ctx = int(n_ctx)
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = int(n_threads)
        cparams.n_threads_batch = int(n_threads)
        cparams.no_perf = True
        self._ctx = _llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            _llama.llama_model_free(self._model)
            self._model = None
            raise RuntimeError(f"llama.cpp failed to create a context for {path}")
        self.max_context = int(_llama.llama_n_ctx(self._ctx))
        self._mem = _llama.llama_get_memory(self._ctx)
        self._batch = _llama.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: list[int] = []
        self.forward_calls = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the llama.cpp context, batch and model (also done on garbage collection)."""
        if _llama is None:
            return
        if getattr(self, "_batch", None) is not None:
            _llama.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            _llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            _llama.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - timing depends on the GC
        try:
            self.close()
        except Exception:
            pass

    # -- Backend interface -----------------------------------------------------------------------------------

    def reset(self) -> None:
        _llama.llama_memory_clear(self._mem, True)
        self.tokens = []

    def truncate(self, length: int) -> None:
        """Keep the KV of the first ``length`` cached tokens only: removes positions [length, inf) of sequence 0."""
        if length < len(self.tokens):
            length = max(int(length), 0)
            if not _llama.llama_memory_seq_rm(self._mem, 0, length, -1):
                raise RuntimeError("llama.cpp refused to remove KV entries (llama_memory_seq_rm)")
            del self.tokens[length:]

    def extend(self, new_tokens: list[int], num_logits: int = 1) -> torch.Tensor:
        """Feed ``new_tokens`` after the cached ones; return float32 logits [num_logits, vocab_size] (last positions).

        Only the last ``num_logits`` positions request outputs from llama.cpp (no work is spent on the others).
        """
        n = len(new_tokens)
        if n == 0:
            raise ValueError("extend needs at least one new token")
        if not 1 <= num_logits <= n:
            raise ValueError(f"num_logits must be in [1, {n}], got {num_logits}")
        if len(self.tokens) + n > self.max_context:
            raise ValueError(
                f"sequence of {len(self.tokens) + n} tokens exceeds the llama.cpp context of {self.max_context}"
            )
        out = np.empty((num_logits, self.vocab_size), dtype=np.float32)
        if self.vocab_size > self.n_vocab:
            out[:, self.n_vocab :] = -np.inf
        first_logit = n - num_logits  # index in new_tokens of the first position whose logits are returned
        base = len(self.tokens)
        batch = self._batch
        row = 0
        try:
            for start in range(0, n, self.n_batch):
                chunk = new_tokens[start : start + self.n_batch]
                m = len(chunk)
                outputs: list[int] = []
                for j, tok in enumerate(chunk):
                    i = start + j
                    batch.token[j] = int(tok)
                    batch.pos[j] = base + i
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = 0
                    want = i >= first_logit
                    batch.logits[j] = want
                    if want:
                        outputs.append(j)
                batch.n_tokens = m
                rc = _llama.llama_decode(self._ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode failed with code {rc}")
                for j in outputs:
                    ptr = _llama.llama_get_logits_ith(self._ctx, j)
                    ctypes.memmove(out[row].ctypes.data, ptr, self.n_vocab * 4)
                    row += 1
        except BaseException:
            # keep the cache consistent with self.tokens: drop whatever a partial extend left behind
            _llama.llama_memory_seq_rm(self._mem, 0, base, -1)
            raise
        self.tokens.extend(int(t) for t in new_tokens)
        self.forward_calls += 1
        return torch.from_numpy(out)
