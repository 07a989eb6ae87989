"""Hugging Face transformers backend: one batched ``DynamicCache`` holding every row, with exact per-row rollback.

Layout. The cache has one batch entry per row and a shared sequence axis of *slots*. A row's history is an
ordered list of slots (``_Row.slots``); a slot not in that list is garbage for the row and masked out. Each
forward appends W new slots to every row (W = the widest request; narrower rows pad with queries that attend
only to themselves). Rolling a row back, dropping a rejected proposal, or keeping an accepted tree path is
therefore pure bookkeeping on slot lists, never a copy: positions are explicit (``position_ids``) and RoPE is
applied when a key is written, so a key stays valid wherever its slot lies. Garbage accumulates and is
compacted away (one gather per layer) when it exceeds :attr:`HFBackend.slack` slots.

Fast path: a single row with a contiguous history and a chain proposal is scored exactly as a plain causal
forward (no custom mask), so batch-size-1 chains cost and compute what they did before rows existed. A row
that joins with a long prompt is prefilled in its own forward (no padding of the other rows to its length).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from verispec.backends.base import ScoreRequest, common_prefix_len, is_chain, plan_requests
from verispec.core.verify.tree import ancestor_matrix, tree_depths
from verispec.defaults import TARGET_BACKENDS

__all__ = ["HFBackend"]


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)  # history tokens with KV
    slots: list[int] = field(default_factory=list)  # their cache slots, in order
    p_tokens: list[int] = field(default_factory=list)  # pending proposal nodes
    p_parents: list[int] = field(default_factory=list)
    p_slots: list[int] = field(default_factory=list)

    def drop_pending(self) -> None:
        self.p_tokens, self.p_parents, self.p_slots = [], [], []

    def sync(self, ids: list[int], keep: int) -> list[int]:
        """Roll back to the ``keep`` tokens shared with ``ids[:-1]`` (:func:`common_prefix_len`); return the tokens
        to feed (>= 1)."""
        self.drop_pending()
        del self.tokens[keep:], self.slots[keep:]
        return list(ids[keep:])


class HFBackend:
    """A transformers causal LM scoring proposals for a batch of rows (see :mod:`verispec.backends.base`)."""

    name = "hf"
    #: the capability is stated once, on the target backend's spec
    supports_trees = TARGET_BACKENDS["hf"].tree_attention

    def __init__(self, model: PreTrainedModel, slack: int = 64, prefill_threshold: int = 16) -> None:
        self.model = model.eval()
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_context = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.slack, self.prefill_threshold = slack, prefill_threshold
        self.forward_calls = 0
        self._rows: dict[int, _Row] = {}
        self._order: list[int] = []  # row id of each batch entry of the cache
        self._next_id = 0
        self.cache: DynamicCache | None = None
        self._len = 0  # slots in the cache

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    # -- rows ---------------------------------------------------------------------------------------------
    def add_row(self) -> int:
        rid = self._next_id
        self._next_id += 1
        self._rows[rid] = _Row()
        return rid

    def remove_row(self, row: int) -> None:
        self._row(row)
        del self._rows[row]

    def cached_tokens(self, row: int) -> list[int]:
        return list(self._row(row).tokens)

    def reset(self) -> None:
        """Drop every row and the cache."""
        self._rows, self._order, self.cache, self._len = {}, [], None, 0

    def _row(self, row: int) -> _Row:
        try:
            return self._rows[row]
        except KeyError:
            raise ValueError(f"row {row} does not exist (add_row first)") from None

    # -- cache layout ---------------------------------------------------------------------------------------
    def _layers(self) -> list:
        return list(self.cache.layers) if self.cache is not None else []

    def _relayout(self) -> None:
        """Make the cache's batch axis hold exactly the live rows (new rows get garbage slots)."""
        live = sorted(self._rows)
        if live == self._order:
            return
        if not live or self.cache is None or self._len == 0 or not self._layers() or self._layers()[0].keys is None:
            self._order, self.cache, self._len = live, None, 0
            for r in self._rows.values():
                r.tokens, r.slots = [], []
                r.drop_pending()
            return
        old = {rid: b for b, rid in enumerate(self._order)}

        def rebatch(t: torch.Tensor) -> torch.Tensor:  # kept rows in order; a new row starts as garbage
            return torch.cat([t[old[rid] : old[rid] + 1] if rid in old else torch.zeros_like(t[:1]) for rid in live])

        for layer in self._layers():
            layer.keys, layer.values = rebatch(layer.keys), rebatch(layer.values)
        self._order = live

    def _grow(self, n: int) -> None:
        """Append ``n`` garbage slots to every row."""
        for layer in self._layers():
            k, v = layer.keys, layer.values
            layer.keys = torch.cat([k, k.new_zeros(k.shape[0], k.shape[1], n, k.shape[3])], dim=2)
            layer.values = torch.cat([v, v.new_zeros(v.shape[0], v.shape[1], n, v.shape[3])], dim=2)
        self._len += n

    def _compact(self) -> None:
        """Gather every row's live slots (history, then pending nodes) to the front of the sequence axis."""
        rows = [self._rows[rid] for rid in self._order]
        used = [r.slots + r.p_slots for r in rows]
        new_len = max((len(u) for u in used), default=0)
        if new_len == self._len:
            return
        if all(u == list(range(len(u))) for u in used):
            self._crop(new_len)
            return
        idx = torch.tensor([u + [0] * (new_len - len(u)) for u in used], dtype=torch.long, device=self.device)
        for layer in self._layers():
            k, v = layer.keys, layer.values
            gi = idx[:, None, :, None].expand(k.shape[0], k.shape[1], new_len, k.shape[3])
            layer.keys, layer.values = k.gather(2, gi), v.gather(2, gi)
        for r in rows:
            n = len(r.slots)
            r.slots = list(range(n))
            r.p_slots = list(range(n, n + len(r.p_slots)))
        self._len = new_len

    def _crop(self, n: int) -> None:
        """Keep the first ``n`` slots of every row. Slices each layer itself rather than calling ``Cache.crop``,
        whose meaning differs across transformers versions: 4.x reads ``crop(0)`` as "keep no slot", 5.x as
        "remove none" and deprecates a positive argument ("keep that many")."""
        for layer in self._layers():
            if layer.keys is not None:
                layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]
        self._len = n

    def _undo(self, n: int) -> None:
        """After a failed forward, which may have appended KV to some layers: back to the ``n`` slots before it."""
        if n == 0:  # no row holds a slot: drop the cache (a layerless one made for the forward included)
            self.cache, self._len = None, 0
        else:
            self._crop(n)

    def _maybe_compact(self, extra: int) -> None:
        if self.cache is None:
            return
        used = max((len(r.slots) + len(r.p_slots) for r in self._rows.values()), default=0)
        if self._len - used > self.slack:
            self._compact()

    # -- scoring ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """One forward for every request; float32 logits per request (see :mod:`verispec.backends.base`)."""
        if not requests:
            return []
        plans = plan_requests(requests, self._plan)
        self._relayout()
        for req, plan in zip(requests, plans, strict=True):
            if len(plan["feed"]) > self.prefill_threshold and not self._rows[req.row].tokens:
                self._prefill(req.row, plan)
        if len(self._order) == 1 and self._fast_ok(requests[0], plans[0]):
            out = [self._forward_fast(requests[0], plans[0])]
        else:
            out = self._forward_masked(requests, plans)
        self.forward_calls += 1
        return out

    def _plan(self, req: ScoreRequest) -> dict:
        r = self._row(req.row)
        if req.ids is None:
            if not r.p_tokens and not r.tokens:
                raise ValueError(f"row {req.row} has no pending proposal to continue")
            n_old = len(r.p_tokens)
            for i, par in enumerate(req.parents):
                if not -1 <= par < n_old + i:
                    raise ValueError(f"node {n_old + i} has parent {par}: not -1 or an earlier node")
            self._check_vocab(req.tokens)
            feed: list[int] = []
        else:
            for i, par in enumerate(req.parents):
                if not -1 <= par < i:
                    raise ValueError(f"node {i} has parent {par}: not -1 or an earlier node")
            keep = common_prefix_len(r.tokens, req.ids[:-1])
            # every token the forward will embed (the cached prefix was checked when it was fed), before any change
            self._check_vocab(list(req.ids[keep:]) + list(req.tokens))
            feed = r.sync(req.ids, keep)
        new_depths = tree_depths(r.p_parents + list(req.parents))[len(r.p_parents) :]
        linear = len(r.tokens) + len(feed)
        deepest = max(new_depths, default=0)
        if linear + deepest > self.max_context:
            raise ValueError(
                f"sequence of {linear + deepest} tokens exceeds the model's context of {self.max_context}"
            )
        return {"feed": feed, "depths": new_depths}

    def _check_vocab(self, tokens: Sequence[int]) -> None:
        vocab = self.vocab_size
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} out of the vocabulary [0, {vocab})")

    def _prefill(self, rid: int, plan: dict) -> None:
        """Prefill a fresh row's history (all but its last token) in its own batch-1 forward."""
        r = self._rows[rid]
        feed = plan["feed"]
        head, plan["feed"] = feed[:-1], feed[-1:]
        cache = DynamicCache()
        ids = torch.tensor([head], dtype=torch.long, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.forward_calls += 1
        n = len(head)
        if self.cache is None:
            if len(self._order) == 1:
                self.cache, self._len = cache, n
                r.tokens, r.slots = list(head), list(range(n))
                return
            self.cache = copy.deepcopy(cache)  # same layer types; batch axis re-made for every row
            for layer in self._layers():
                layer.keys = layer.keys.new_zeros((len(self._order),) + tuple(layer.keys.shape[1:]))
                layer.values = layer.values.new_zeros((len(self._order),) + tuple(layer.values.shape[1:]))
            self._len = n
        self._maybe_compact(n)
        start = len(r.slots)  # the row is fresh: its slots [0, n) are free once the cache has n of them
        if self._len < start + n:
            self._grow(start + n - self._len)
        b = self._order.index(rid)
        for layer, new in zip(self._layers(), cache.layers, strict=True):
            layer.keys[b, :, start : start + n] = new.keys[0]
            layer.values[b, :, start : start + n] = new.values[0]
        r.tokens, r.slots = list(head), list(range(start, start + n))

    def _fast_ok(self, req: ScoreRequest, plan: dict) -> bool:
        r = self._rows[req.row]
        return req.ids is not None and is_chain(req.parents) and r.slots == list(range(len(r.slots)))

    def _record(self, r: _Row, feed: list[int], tokens: list[int], parents: list[int], first_slot: int) -> None:
        r.tokens.extend(feed)
        r.slots.extend(range(first_slot, first_slot + len(feed)))
        s = first_slot + len(feed)
        r.p_tokens.extend(tokens)
        r.p_parents.extend(parents)
        r.p_slots.extend(range(s, s + len(tokens)))

    def _forward_fast(self, req: ScoreRequest, plan: dict) -> torch.Tensor:
        r = self._rows[req.row]
        n = len(r.slots)
        if self.cache is not None and self._len > n:
            self._crop(n)
        if self.cache is None:
            self.cache = DynamicCache()
        feed, tokens = plan["feed"], list(req.tokens)
        ids = torch.tensor([feed + tokens], dtype=torch.long, device=self.device)
        keep = len(tokens) + 1
        try:
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        except BaseException:
            self._undo(n)
            raise
        self.cache = out.past_key_values
        self._record(r, feed, tokens, list(req.parents), n)
        self._len = n + ids.shape[1]
        return out.logits[0, -keep:].float().cpu()  # verification runs on the CPU in float64

    def _forward_masked(self, requests: Sequence[ScoreRequest], plans: list[dict]) -> list[torch.Tensor]:
        widths = [len(p["feed"]) + len(q.tokens) for q, p in zip(requests, plans, strict=True)]
        w = max(widths)
        self._maybe_compact(w)
        if self.cache is None:
            self.cache = DynamicCache()
        length, b_size = self._len, len(self._order)
        by_row = {q.row: (q, p) for q, p in zip(requests, plans, strict=True)}
        allowed = torch.zeros(b_size, w, length + w, dtype=torch.bool)
        ids = torch.zeros(b_size, w, dtype=torch.long)
        pos = torch.zeros(b_size, w, dtype=torch.long)
        pad = torch.arange(w)
        allowed[:, pad, length + pad] = True  # every query sees its own slot (padding queries: only that)
        picks: list[tuple[int, int, int]] = []  # (batch index, first query, count) per request, in order
        for b, rid in enumerate(self._order):
            if rid not in by_row:
                continue
            req, plan = by_row[rid]
            r = self._rows[rid]
            feed, tokens, nf, nn = plan["feed"], list(req.tokens), len(plan["feed"]), len(req.tokens)
            hist = torch.tensor(r.slots, dtype=torch.long)
            allowed[b, : nf + nn, hist] = True
            if nf:
                allowed[b, :nf, length : length + nf] = torch.ones(nf, nf, dtype=torch.bool).tril()
                allowed[b, nf : nf + nn, length : length + nf] = True
            n_old = len(r.p_tokens)
            all_parents = r.p_parents + list(req.parents)
            all_slots = r.p_slots + list(range(length + nf, length + nf + nn))
            if nn:  # a node sees its ancestors and itself (the tree's one mask rule, core's ancestor relation)
                anc = ancestor_matrix(all_parents)[n_old:]
                slots = torch.tensor(all_slots, dtype=torch.long)
                for k in range(nn):
                    allowed[b, nf + k, slots[anc[k]]] = True
            ids[b, : nf + nn] = torch.tensor(feed + tokens, dtype=torch.long)
            linear = len(r.tokens) + nf
            pos[b, :nf] = torch.arange(len(r.tokens), linear)
            if nn:
                pos[b, nf : nf + nn] = torch.tensor(plan["depths"], dtype=torch.long) + (linear - 1)
            first = nf - 1 if nf else nf
            picks.append((b, first, nf + nn - first))
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        try:
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask[:, None].to(self.device),
                position_ids=pos.to(self.device),
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=w,
            )
        except BaseException:
            self._undo(length)  # the rows' slot lists are recorded only after a forward that succeeded
            raise
        for req in requests:
            self._record(self._rows[req.row], by_row[req.row][1]["feed"], list(req.tokens), list(req.parents), length)
        self.cache = out.past_key_values
        self._len = length + w
        logits = out.logits
        result = [logits[b, first : first + cnt].float().cpu() for b, first, cnt in picks]
        order = {rid: i for i, rid in enumerate(rid for rid in self._order if rid in by_row)}
        return [result[order[q.row]] for q in requests]

    # -- commit ----------------------------------------------------------------------------------------------
    def commit(self, row: int, path: Sequence[int]) -> None:
        """Keep the pending nodes on root-down ``path`` as history (no KV moves); drop the other nodes."""
        r = self._row(row)
        prev = -1
        for node in path:
            if not 0 <= node < len(r.p_tokens) or r.p_parents[node] != prev:
                raise ValueError(f"{list(path)} is not a root-down path of the pending proposal")
            prev = node
        r.tokens.extend(r.p_tokens[n] for n in path)
        r.slots.extend(r.p_slots[n] for n in path)
        r.drop_pending()

    # -- single-sequence conveniences (tests, tools) ----------------------------------------------------------
    def forward_ids(self, row: int, ids: list[int], tokens: Sequence[int] = (),
                    parents: Sequence[int] | None = None) -> torch.Tensor:
        """``score`` for one row: logits [1 + len(tokens), V] after ``ids`` then the proposal ``tokens``."""
        return self.score([ScoreRequest(row, list(ids), list(tokens), None if parents is None else list(parents))])[0]

    def kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The row's history KV per layer, in order (keys, values of shape [heads, len, head_dim])."""
        r = self._row(row)
        if self.cache is None or not r.slots:
            return []
        b = self._order.index(row)
        idx = torch.tensor(r.slots, dtype=torch.long, device=self.device)
        return [(layer.keys[b][:, idx], layer.values[b][:, idx]) for layer in self._layers()]
