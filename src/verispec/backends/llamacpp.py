"""llama.cpp backend (via ``llama-cpp-python``'s low-level C API): GGUF models behind the row contract.

Implements :class:`~verispec.backends.base.Backend` (see that module for the contract): each row is one llama.cpp
*sequence id* in a unified KV cache (``kv_unified``; ``n_seq_max = max_rows``; ``max_rows * n_ctx`` cells, so
every row can hold ``n_ctx`` = :attr:`LlamaCppBackend.max_context` tokens). :meth:`LlamaCppBackend.score` builds
ONE ``llama_batch`` over all requests (per-token ``seq_id`` and ``pos``; the ``logits`` flag is set only on the
positions the contract returns: the last fed history token and the proposal nodes) and runs ``llama_decode``
(split into several calls only when the batch exceeds ``n_batch`` tokens, counted once in ``forward_calls``).
It returns raw logits (no sampling inside llama.cpp): verispec applies its own processors and samples itself,
so the same code serves as a drafter backend (:class:`~verispec.drafters.ModelDrafter`) and as the target.

Rollback is exact and per row: ``llama_memory_seq_rm(mem, seq, keep, -1)`` drops the row's cells from position
``keep`` on (a pure-attention model such as Qwen2 keeps one KV cell per token, so removal leaves no trace).
Each request syncs its row to ``ids`` (longest common prefix with the cached tokens, at least the last token
re-fed), and :meth:`LlamaCppBackend.commit` keeps the accepted prefix of a chain proposal and removes the rest.

Prefix cache (``prefix_cache=True``, the default): a removed row's sequence is *retired*, not cleared, and keeps
its history cells until its sequence id is needed (least recently retired first). A new row, at its first
score, starts from the longest prefix of its ``ids`` that a retired sequence (adopted: its tail is removed) or a
live row's history (shared with ``llama_memory_seq_cp``: in the unified cache a cell may belong to several
sequences, so nothing is copied) already holds, and feeds only the rest. Chat prompts share their template's
system prefix and the harness runs several methods on one prompt, so the prefill is paid once. The reused cells
were computed in another batch shape, so the logits equal a fresh prefill's up to llama.cpp's batch-shape
tolerance (as for any block vs single steps), not bit for bit; ``prefix_cache=False`` always prefills anew.

Trees: ``supports_trees = False``. llama.cpp could express a token tree with per-token sequence sets (one
temporary sequence per node, ``llama_memory_seq_cp`` to share ancestors), but on a CPU a tree of n nodes costs
what an n-token block costs (no tree-specific kernel; see :meth:`LlamaCppBackend.block_cost`) and the block-cost
curve makes wide trees a loss here: see the README's llama.cpp section for the numbers.

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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from verispec.backends.base import ScoreRequest, common_prefix_len, plan_requests
from verispec.core.schedule import interpolate_costs
from verispec.defaults import DEFAULT_CONTEXT, TARGET_BACKENDS

__all__ = ["DEFAULT_BLOCK_COSTS", "LlamaCppBackend", "llama_cpp_available"]

try:  # optional dependency: requirements-fast.txt
    import llama_cpp as _llama
except ImportError:  # pragma: no cover - depends on the environment
    _llama = None

_BACKEND_INITIALISED = False

#: cost of scoring a block of k tokens in one llama_decode, in single-token decode steps, measured on this
#: project's 2-core CPU with the 1.5B Q4_K_M target; linear interpolation between the points and
#: linear extrapolation past the last one. :meth:`LlamaCppBackend.measure_block_costs` measures it anew.
DEFAULT_BLOCK_COSTS: dict[int, float] = {1: 1.0, 2: 1.6, 4: 2.6, 6: 3.7, 8: 4.5, 12: 5.7}


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


@dataclass
class _Row:
    seq: int | None = None  # the llama.cpp sequence id holding this row's cells (bound at its first score)
    tokens: list[int] = field(default_factory=list)  # history tokens with KV (positions 0..len-1)
    pending: list[int] = field(default_factory=list)  # pending chain proposal nodes (positions after history)

    def n_cells(self) -> int:
        return len(self.tokens) + len(self.pending)


class LlamaCppBackend:
    """A GGUF model run by llama.cpp, scoring proposals for a batch of rows (see :mod:`verispec.backends.base`).

    ``n_ctx``: the most tokens one row may hold (:attr:`max_context`); ``max_rows``: the most rows at once
    (llama.cpp sequences; the KV cache holds ``n_ctx * max_rows`` cells, allocated up front: about 28 KB per
    cell for the 1.5B Qwen target, 12 KB for the 0.5B draft). ``n_batch``: the most tokens per ``llama_decode``.
    ``block_costs``: the block-cost curve returned by :meth:`block_cost` (k -> cost in single-step units;
    default :data:`DEFAULT_BLOCK_COSTS`).
    """

    name = "llamacpp"

    supports_trees = TARGET_BACKENDS["llamacpp"].tree_attention  # stated once, on the spec

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_CONTEXT,
        n_threads: int = 2,
        vocab_size: int | None = None,
        n_batch: int = 512,
        max_rows: int = 8,
        block_costs: dict[int, float] | None = None,
        prefix_cache: bool = True,
        share_model: LlamaCppBackend | None = None,
    ) -> None:
        if _llama is None:
            raise ImportError("LlamaCppBackend needs llama-cpp-python: pip install -r requirements-fast.txt")
        path = os.fspath(gguf_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path}")
        if not 1 <= int(max_rows) <= 256:
            raise ValueError(f"max_rows must be in [1, 256] (llama.cpp's sequence limit), got {max_rows}")
        if int(n_ctx) < 1 or int(n_batch) < 1 or int(n_threads) < 1:
            raise ValueError("n_ctx, n_batch and n_threads must be >= 1")
        _silence_logs()
        _init_backend()
        self.gguf_path = path
        self._model = None
        self._ctx = None
        self._batch = None
        # share_model: a context of our own on another backend's loaded weights (row isolation); that backend
        # owns them and is kept alive as long as this one
        self._owner = share_model
        if share_model is not None:
            if share_model.gguf_path != path:
                raise ValueError(f"share_model holds {share_model.gguf_path}, not {path}")
            self._model = share_model._model
        else:
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
        self.max_rows = int(max_rows)
        self.n_threads = int(n_threads)
        cparams = _llama.llama_context_default_params()
        cparams.n_ctx = int(n_ctx) * self.max_rows
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.max_rows
        cparams.kv_unified = True
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        self._ctx = _llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise RuntimeError(f"llama.cpp failed to create a context for {path}")
        self.max_context = int(n_ctx)
        self._mem = _llama.llama_get_memory(self._ctx)
        self._batch = _llama.llama_batch_init(self.n_batch, 0, 1)
        self.forward_calls = 0
        self.block_costs = dict(DEFAULT_BLOCK_COSTS if block_costs is None else block_costs)
        self._rows: dict[int, _Row] = {}
        self._free_seqs = list(range(self.max_rows))  # sequences holding no cells
        self._retired: dict[int, list[int]] = {}  # seq -> history of a removed row, least recently retired first
        self.prefix_cache = bool(prefix_cache)
        self.prefix_tokens_reused = 0  # prompt tokens a new row did not have to feed (prefix cache hits)
        self._next_id = 0

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
            if getattr(self, "_owner", None) is None:
                _llama.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - timing depends on the GC
        try:
            self.close()
        except Exception:
            pass

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    # -- rows ------------------------------------------------------------------------------------------------
    def add_row(self) -> int:
        """A new empty row. It takes one of the ``max_rows`` llama.cpp sequences at its first :meth:`score`
        (rows queued by a scheduler hold none), and gives it back in :meth:`remove_row`."""
        rid = self._next_id
        self._next_id += 1
        self._rows[rid] = _Row()
        return rid

    def remove_row(self, row: int) -> None:
        r = self._row(row)
        del self._rows[row]
        if r.seq is None:
            return
        if self.prefix_cache and r.tokens:  # keep the history for a later row with the same prefix
            self._truncate(r, len(r.tokens))
            self._retired[r.seq] = r.tokens  # the row is gone: its list is not shared
        else:
            _llama.llama_memory_seq_rm(self._mem, r.seq, -1, -1)
            self._free_seqs.append(r.seq)
            self._free_seqs.sort()

    def _take_seq(self) -> int:
        """An empty sequence id: a never/no longer used one, else the least recently retired one, cleared."""
        if self._free_seqs:
            return self._free_seqs.pop(0)
        seq = next(iter(self._retired))
        del self._retired[seq]
        _llama.llama_memory_seq_rm(self._mem, seq, -1, -1)
        return seq

    def _bind(self, r: _Row, ids: Sequence[int] | None) -> None:
        """Give ``r`` a sequence; with the prefix cache, seed its history with the longest cached prefix of
        ``ids[:-1]`` (the last token is always fed: its logits are returned)."""
        if r.seq is not None:
            return
        want = list(ids[:-1]) if ids and self.prefix_cache else []
        best, src, retired = 0, None, False
        for seq, toks in self._retired.items():
            if (n := common_prefix_len(toks, want)) > best:
                best, src, retired = n, seq, True
        for other in self._rows.values():
            if other.seq is not None and (n := common_prefix_len(other.tokens, want)) > best:
                best, src, retired = n, other.seq, False
        if retired:  # adopt the retired sequence, minus its tail
            del self._retired[src]
            r.seq = src
            _llama.llama_memory_seq_rm(self._mem, src, best, -1)
        else:
            r.seq = self._take_seq()
            if src is not None:  # share the live row's history cells
                _llama.llama_memory_seq_cp(self._mem, src, r.seq, 0, best)
        r.tokens = want[:best]
        self.prefix_tokens_reused += best

    def cached_tokens(self, row: int) -> list[int]:
        return list(self._row(row).tokens)

    def reset(self) -> None:
        """Drop every row and clear the cache (the prefix cache too)."""
        _llama.llama_memory_clear(self._mem, True)
        self._rows = {}
        self._free_seqs = list(range(self.max_rows))
        self._retired = {}

    def _row(self, row: int) -> _Row:
        try:
            return self._rows[row]
        except KeyError:
            raise ValueError(f"row {row} does not exist (add_row first)") from None

    def _truncate(self, r: _Row, keep: int) -> None:
        """Drop the row's cells from position ``keep`` on (history past it and any pending nodes)."""
        if keep < r.n_cells():
            if not _llama.llama_memory_seq_rm(self._mem, r.seq, keep, -1):
                raise RuntimeError("llama.cpp refused to remove KV entries (llama_memory_seq_rm)")
        del r.tokens[keep:]
        r.pending = []

    # -- scoring ---------------------------------------------------------------------------------------------
    def _plan(self, req: ScoreRequest) -> tuple[list[int], list[int]]:
        """Validate one request; return (history tokens to feed, proposal tokens). Touches no state."""
        r = self._row(req.row)
        tokens = [int(t) for t in req.tokens]
        if req.ids is None:
            if not r.tokens:
                raise ValueError(f"row {req.row} has no pending proposal to continue")
            n_old = len(r.pending)
            for i, par in enumerate(req.parents):  # type: ignore[arg-type]
                if par != n_old + i - 1:
                    raise ValueError("LlamaCppBackend scores chains only (supports_trees is False): "
                                     f"node {n_old + i} has parent {par}, expected {n_old + i - 1}")
            feed: list[int] = []
            base = r.n_cells()
        else:
            for i, par in enumerate(req.parents):  # type: ignore[arg-type]
                if par != i - 1:
                    raise ValueError("LlamaCppBackend scores chains only (supports_trees is False): "
                                     f"node {i} has parent {par}, expected {i - 1}")
            ids = [int(t) for t in req.ids]
            keep = common_prefix_len(r.tokens, ids[:-1])
            feed = ids[keep:]
            base = keep
        vocab = self.vocab_size
        if any(not 0 <= t < self.n_vocab for t in feed + tokens):
            bad = next(t for t in feed + tokens if not 0 <= t < self.n_vocab)
            raise ValueError(f"token id {bad} out of the model's vocabulary [0, {self.n_vocab}) (vocab_size {vocab})")
        if base + len(feed) + len(tokens) > self.max_context:
            raise ValueError(f"sequence of {base + len(feed) + len(tokens)} tokens exceeds the llama.cpp context "
                             f"of {self.max_context}")
        return feed, tokens

    def score(self, requests: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """One batched ``llama_decode`` for every request; float32 logits per request (see the contract)."""
        if not requests:
            return []
        plans = plan_requests(requests, self._plan)  # validate everything before any state changes
        unbound = [q for q in requests if self._rows[q.row].seq is None]
        free = len(self._free_seqs) + len(self._retired)
        if len(unbound) > free:
            raise ValueError(f"more than max_rows={self.max_rows} rows scored at once: {len(unbound)} new rows but "
                             f"only {free} free llama.cpp sequences (remove finished rows, or raise "
                             "LlamaCppBackend(max_rows=...))")
        for q in unbound:
            self._bind(self._rows[q.row], q.ids)
        if unbound and self.prefix_cache:  # a new row may start from a cached prefix: feed less
            plans = plan_requests(requests, self._plan)
        # sync every row (exact rollback), then lay the batch out: per token (token, pos, seq, wants logits)
        entries: list[tuple[int, int, int, bool]] = []
        outs: list[np.ndarray] = []
        firsts: list[int] = []  # index into the output rows of each request's first returned row
        n_out = 0
        before = []
        for req, (feed, tokens) in zip(requests, plans, strict=True):
            r = self._rows[req.row]
            if req.ids is not None:
                self._truncate(r, len(req.ids) - len(feed))
            before.append(r.n_cells())
            pos = r.n_cells()
            for j, t in enumerate(feed):
                entries.append((t, pos + j, r.seq, j == len(feed) - 1))
            pos += len(feed)
            for j, t in enumerate(tokens):
                entries.append((t, pos + j, r.seq, True))
            n_rows = (1 if feed else 0) + len(tokens)
            out = np.empty((n_rows, self.vocab_size), dtype=np.float32)
            if self.vocab_size > self.n_vocab:
                out[:, self.n_vocab :] = -np.inf
            outs.append(out)
            firsts.append(n_out)
            n_out += n_rows
        flat = [o[i] for o in outs for i in range(o.shape[0])]  # output rows in batch order
        try:
            self._decode(entries, flat)
        except BaseException:
            for req, b in zip(requests, before, strict=True):  # leave no partial writes behind
                r = self._rows[req.row]
                _llama.llama_memory_seq_rm(self._mem, r.seq, b, -1)
                r.pending = [] if req.ids is not None else r.pending
            raise
        for req, (feed, tokens) in zip(requests, plans, strict=True):
            r = self._rows[req.row]
            r.tokens.extend(feed)
            r.pending.extend(tokens)
        self.forward_calls += 1
        return [torch.from_numpy(o) for o in outs]

    def _decode(self, entries: list[tuple[int, int, int, bool]], flat: list[np.ndarray]) -> None:
        """Feed ``entries`` in ``n_batch`` chunks; copy each requested position's logits into ``flat`` in order."""
        batch, row = self._batch, 0
        nbytes = self.n_vocab * 4
        for start in range(0, len(entries), self.n_batch):
            chunk = entries[start : start + self.n_batch]
            wanted = []
            for j, (tok, pos, seq, want) in enumerate(chunk):
                batch.token[j] = tok
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = want
                if want:
                    wanted.append(j)
            batch.n_tokens = len(chunk)
            rc = _llama.llama_decode(self._ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc}")
            for j in wanted:
                ptr = _llama.llama_get_logits_ith(self._ctx, j)
                ctypes.memmove(flat[row].ctypes.data, ptr, nbytes)
                row += 1

    # -- commit ----------------------------------------------------------------------------------------------
    def commit(self, row: int, path: Sequence[int]) -> None:
        """Keep the pending chain nodes ``path`` (= [0, 1, ..., m - 1]) as history; remove the others' cells."""
        r = self._row(row)
        path = list(path)
        if path != list(range(len(path))) or len(path) > len(r.pending):
            raise ValueError(f"{path} is not a root-down path of the pending proposal ({len(r.pending)} nodes)")
        kept = r.pending[: len(path)]
        self._truncate(r, r.n_cells() - len(r.pending) + len(path))  # clears pending
        r.tokens.extend(kept)

    # -- costs -----------------------------------------------------------------------------------------------
    def block_cost(self, k: int) -> float:
        """Cost of scoring a k-token block in one call, in single-token steps (cost(1) = 1): see ``block_costs``."""
        return interpolate_costs(self.block_costs, int(k))

    def measure_block_costs(self, ks: Sequence[int] = (1, 2, 4, 6, 8, 12), repeats: int = 5,
                            context: int = 128) -> dict[int, float]:
        """Measure the block-cost curve on this model and machine (median seconds per k-token block after a
        ``context``-token history, divided by that of k=1) and use it from now on; returns it. Uses a
        temporary row, so at least one row must be free."""
        rid = self.add_row()
        try:
            hist = [int(t) % self.n_vocab for t in range(100, 100 + context)]
            self.score([ScoreRequest(rid, hist)])
            self.commit(rid, [])
            secs: dict[int, float] = {}
            for k in sorted(set(int(k) for k in ks) | {1}):
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    self.score([ScoreRequest(rid, hist, [7] * (k - 1))])
                    times.append(time.perf_counter() - t0)
                secs[k] = float(np.median(times))
        finally:
            self.remove_row(rid)
        self.block_costs = {k: s / secs[1] for k, s in secs.items()}
        return dict(self.block_costs)

    # -- tokenizer check and conveniences --------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (to check that a HF tokenizer gives the same ids)."""
        data = text.encode()
        cap = len(data) + 16
        buf = (_llama.llama_token * cap)()
        n = _llama.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} slots")
        return list(buf[:n])

    def eos_ids(self) -> list[int]:
        """The GGUF's end-of-generation tokens (eos, eot) as llama.cpp's vocab declares them."""
        ids = {int(_llama.llama_vocab_eos(self._vocab)), int(_llama.llama_vocab_eot(self._vocab))}
        return sorted(t for t in ids if 0 <= t < self.n_vocab)

    def forward_ids(self, row: int, ids: list[int], tokens: Sequence[int] = ()) -> torch.Tensor:
        """``score`` for one row: logits [1 + len(tokens), V] after ``ids`` then the chain ``tokens``."""
        return self.score([ScoreRequest(row, list(ids), list(tokens))])[0]
