"""The reference law of short continuations, by enumeration.

A continuation is an outcome ``(text, ended)``: the text the engine returns and whether it ended on an
end-of-sequence token (``finish_reason`` "stop") rather than at ``max_tokens``. Its law is computed over token
paths and folded onto outcomes (paths cut at their first end token, then decoded; paths with the same text merge,
which only makes the test coarser). The engine's stopping at an end token does not change the law of the tokens
before it, so the cut law of paths generated past it is exact.

Two references:

* :class:`ModelReference` (``--reference-model``: a GGUF run by verispec's llama.cpp backend, or an HF directory
  run by transformers): exact for the given weights. The lossless law is the product of the processed target
  distributions p (bias, penalties with the path's history, temperature, top-k / top-p / min-p: the same code the
  engine verifies with) along each path; a declared lossy rule's law is the rule's exact induced law over whole
  continuations, :func:`verispec.analysis.sequence.sequence_distribution` with the draft model's q and the engine's
  round structure (gamma). Its float noise is measured (:meth:`ModelReference.noise_tv`).
* :class:`UrlReference` (``--reference-url``: an endpoint of the same model without speculation): the law from the
  endpoint's top-20 logprobs at every prefix. They are either of the processed distribution (verispec's: they sum
  to 1 over the kept tokens) or raw log-softmax (vLLM's default), which is processed here (temperature, then
  top-k renormalized; raw needs top_k <= 20 and no penalties or bias). Exact when the endpoint re-tokenizes
  ``prompt + prefix text`` into the same tokens (a character or whitespace-split boundary; checked where the
  endpoint echoes prompt tokens) and the processed law keeps at most 20 tokens.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

import torch

from verispec import models
from verispec.analysis.sequence import sequence_distribution
from verispec.api import load_llamacpp_target
from verispec.audit.client import AuditInputError, EngineClient
from verispec.backends.base import ScoreRequest
from verispec.backends.hf import HFBackend
from verispec.core import rules as _rules
from verispec.core.sampling import History, SamplingConfig, process
from verispec.options import options
from verispec.runtime.grammar import GrammarCompiler

__all__ = ["EOS_PIECES", "ModelReference", "Outcome", "UrlReference", "fold"]

Outcome = tuple[str, bool]
#: end-of-sequence token texts an endpoint's logprobs may show (an end token has no text in the answer)
EOS_PIECES = frozenset({"<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>", "<|end|>", "<eos>", "<|end_of_text|>"})
#: raw logit gap below which the k-th and (k + 1)-th tokens count as a near-tie at the top-k boundary: the
#: engine's own kernels may order them otherwise. Measured: verispec serve's batched Q4_K_M llama.cpp target
#: swapped two tokens 0.023 apart (a false fail); quantized kernels moved some prompts' laws by TV up to 0.035
#: between batch shapes. Two float32 runs of the same transformers model agree far closer (tie_gap 1e-6 there).
TIE_GAP = 0.1
#: rows the reference's backend holds: the ``beside other rows`` shape scores every prefix of a law (13 at 3
#: tokens and top-k 3) as rows of one forward
NOISE_ROWS = 16


def fold(paths: dict[tuple, float], is_end: Callable[[Hashable], bool],
         text: Callable[[tuple], str]) -> dict[Outcome, float]:
    """Path law -> outcome law: each path cut at its first end token, decoded, and merged by text."""
    out: dict[Outcome, float] = {}
    for path, prob in paths.items():
        cut = next((i for i, t in enumerate(path) if is_end(t)), None)
        key = (text(path[:cut] if cut is not None else path), cut is not None)
        out[key] = out.get(key, 0.0) + prob
    return out


def _boundary_gap(raw: torch.Tensor, cfg: SamplingConfig, hist: History | None) -> float:
    """How far the truncations' boundaries are from flipping, in logits (inf without truncation): top-k, the
    gap between the k-th and (k + 1)-th logits; top-p, the kept mass's margins on either side of top_p (the mass
    before the last kept token below it, the mass with it at or above it), divided by top_p (1 - top_p), the
    largest change of a mass near top_p per logit of shift; min-p, the smallest distance of any logit from the
    threshold max logit + T log(min_p). An engine whose kernels move logits by about this much may keep another
    set of tokens there, which the audit would read as a defect."""
    gap = math.inf
    vocab = raw.shape[-1]
    if cfg.top_k is not None and cfg.top_k < vocab:
        top = torch.topk(raw, cfg.top_k + 1).values
        gap = min(gap, float(top[-2] - top[-1]))
    if cfg.top_p is not None and cfg.top_p < 1:
        base = process(raw, replace(cfg, top_p=None, min_p=None, eta=None, eta_delta=None), hist)
        cum = torch.cumsum(torch.sort(base, descending=True).values, 0)
        k = int((cum < cfg.top_p).sum())  # the last kept token's index (sorted)
        before = float(cum[k - 1]) if k > 0 else 0.0
        margin = min(float(cum[k]) - cfg.top_p, cfg.top_p - before if k > 0 else math.inf)
        gap = min(gap, margin / (cfg.top_p * (1 - cfg.top_p)))
    if cfg.min_p is not None and cfg.min_p > 0:
        scaled = process(raw, replace(cfg, temperature=1.0, top_k=None, top_p=None, min_p=None, eta=None,
                                      eta_delta=None), hist).clamp_min(1e-300).log()
        rel = (scaled - scaled.max()) - cfg.temperature * math.log(cfg.min_p)
        gap = min(gap, float(rel.abs().min()))
    return gap


def _hf_eos(model: Any, tokenizer: Any) -> list[int]:
    """End token ids of an HF model: its generation config's and its tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted(set(ids))


class ModelReference:
    """A model run on one of verispec's backends: ``prefix ids -> raw logits`` (cached), a tokenizer and the end
    token ids. ``draft`` (another ModelReference) gives q for a declared lossy rule's law."""

    kind = "model"
    logprobs_kind = "computed"

    def __init__(self, backend: Any, tokenizer: Any, eos_ids: list[int], name: str,
                 draft: ModelReference | None = None, max_rows: int = NOISE_ROWS) -> None:
        self.backend, self.tokenizer, self.eos_ids = backend, tokenizer, set(eos_ids)
        self.name, self.draft, self.max_rows = name, draft, max_rows
        self.row = backend.add_row()
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.noise: dict[tuple, dict[str, float]] = {}
        #: structured output the engine is asked for (``response_format``): the law is the grammar-restricted one
        self.response_format: dict | None = None
        self._grammar: Any = None
        self.ties: list[tuple[tuple[int, ...], float]] = []
        self.tie_gap = TIE_GAP

    @classmethod
    def load(cls, path: str | os.PathLike[str], threads: int | None = None, draft: str | None = None,
             dtype: str = "float32") -> ModelReference:
        """A registered model name or ``.gguf`` file (llama.cpp, ``threads`` default every core: the reference
        computes before the audit samples, while the engine under test is idle; give 1 where that engine serves
        other traffic on the same cores, since beside a busy engine one thread runs several times faster than two)
        or an HF directory (transformers, in ``dtype``: the engine's precision, e.g. bfloat16 for a bf16 vLLM,
        since a float32 law differs from a bf16 engine's by more than float noise)."""
        key = os.fspath(path)
        drafted = cls.load(draft, threads, dtype=dtype) if draft else None
        if key.endswith(".gguf") or not os.path.isdir(key):
            try:
                backend, tok, _, eos = load_llamacpp_target(key, threads=threads or os.cpu_count() or 1, n_ctx=512,
                                                            max_rows=NOISE_ROWS)
                return cls(backend, tok, eos, f"{os.path.basename(key)} (llama.cpp)", drafted,
                           max_rows=NOISE_ROWS)
            except ImportError as exc:
                if key.endswith(".gguf"):
                    raise AuditInputError(f"--reference-model {key}: llama.cpp is not installed ({exc}); give an "
                                          f"HF directory or --reference-url") from None
            except (ValueError, OSError) as exc:  # no such model or file, or not a GGUF llama.cpp reads
                raise AuditInputError(f"--reference-model {key}: {exc}") from None
        try:
            model, tok = models.load_model(key, dtype=dtype)
        except (models.ModelError, OSError) as exc:
            raise AuditInputError(f"--reference-model {key}: {exc}") from None
        return cls(HFBackend(model), tok, _hf_eos(model, tok), f"{os.path.basename(key)} (transformers, {dtype})",
                   drafted)

    def encode(self, text: str) -> list[int]:
        if hasattr(self.tokenizer, "encode") and not callable(getattr(self.tokenizer, "apply_chat_template", None)):
            return list(self.tokenizer.encode(text))
        try:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        except TypeError:
            return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: tuple[int, ...]) -> str:
        try:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))
        except TypeError:
            return str(self.tokenizer.decode(list(ids)))

    def _fresh_rows(self, n: int = 1) -> list[int]:
        """``n`` rows of an emptied cache (the first is :attr:`row`): what is scored on them depends on the tokens
        only, never on what the backend held before (a reused prefix is another batch shape, and quantized kernels
        round differently for another shape)."""
        self.backend.reset()
        rows = [self.backend.add_row() for _ in range(n)]
        self.row = rows[0]
        return rows

    def _score_fresh(self, ids: list[int], proposal: list[int] | None = None) -> torch.Tensor:
        """One forward of ``ids`` (+ ``proposal``) from an empty cache (:meth:`_fresh_rows`)."""
        self._fresh_rows()
        req = ScoreRequest(self.row, ids, proposal) if proposal is not None else ScoreRequest(self.row, ids)
        return self.backend.score([req])[0]

    def logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        """Raw next-token logits after ``prefix`` (float64): one forward of the whole prefix from an empty cache,
        cached per prefix."""
        if prefix not in self.cache:
            self.cache[prefix] = self._score_fresh(list(prefix))[0].to(torch.float64)
        return self.cache[prefix]

    def _restricted(self, raw: torch.Tensor, generated: list[int]) -> torch.Tensor:
        """``raw`` with the tokens ``response_format``'s grammar forbids after ``generated`` at -inf (the engine
        masks the logits before processing them; verispec.runtime.grammar)."""
        if self.response_format is None:
            return raw
        if self._grammar is None or self._grammar[0] != self.response_format:
            compiler = GrammarCompiler(self.tokenizer, raw.shape[-1], sorted(self.eos_ids))
            self._grammar = (self.response_format, compiler.constraint(self.response_format))
        constraint = self._grammar[1]
        mask = constraint.allowed(generated) if constraint is not None else None
        return raw if mask is None else raw.masked_fill(~mask[: raw.shape[-1]], float("-inf"))

    def dist_fn(self, prompt: tuple[int, ...], cfg: SamplingConfig) -> Callable[[tuple[int, ...]], torch.Tensor]:
        """prefix -> the processed distribution (bias, penalties with the generated part's history, temperature,
        truncations), as the engine processes p and q. Near-ties at a truncation boundary are recorded
        (:func:`_boundary_gap`)."""
        vocab = None

        def fn(prefix: tuple[int, ...]) -> torch.Tensor:
            nonlocal vocab
            raw = self._restricted(self.logits(prefix), list(prefix[len(prompt):]))
            vocab = raw.shape[-1]
            hist = History.of(list(prompt), list(prefix[len(prompt):]), vocab) if cfg.uses_history else None
            if cfg.temperature > 0:
                gap = _boundary_gap(raw, cfg, hist)
                if gap < self.tie_gap:
                    self.ties.append((prefix, gap))
            return process(raw, cfg, hist)

        return fn

    def paths(self, prompt_ids: list[int], cfg: SamplingConfig, length: int, rule: _rules.Rule | None = None,
              gamma: int = 0, verifier: str = "token") -> dict[tuple, float]:
        """Exact law of ``length``-token paths: the target's (lossless, any verifier) or ``rule``'s induced law
        with the draft's q and ``gamma`` drafts per round (the engine's capped rounds)."""
        prompt = tuple(prompt_ids)
        p_fn = self.dist_fn(prompt, cfg)
        if rule is None or rule.lossless:
            return sequence_distribution("lossless", p_fn, None, 0, length, prompt)
        if self.draft is None:
            raise AuditInputError("a lossy rule's law needs the draft model: give --reference-draft")
        q_fn = self.draft.dist_fn(prompt, cfg)
        return sequence_distribution(rule, p_fn, q_fn, gamma, length, prompt, verifier=verifier)

    def law(self, prompt: str, cfg: SamplingConfig, length: int, rule: _rules.Rule | None = None, gamma: int = 0,
            verifier: str = "token") -> tuple[dict[Outcome, float], dict[tuple, float]]:
        """(outcome law, path law) of the continuations of ``prompt``."""
        paths = self.paths(self.encode(prompt), cfg, length, rule, gamma, verifier)
        return fold(paths, lambda t: t in self.eos_ids, self.decode), paths

    def noise_tv(self, prompt: str, cfg: SamplingConfig, paths: dict[tuple, float]) -> float:
        """The reference's float noise, the measured part of the tolerance: the largest TV between the lossless
        path law as computed (one forward of prompt + prefix per prefix, from an empty cache) and the same law
        computed under another batch shape (:meth:`noise_by_shape`). Measured once per (prompt, settings, length)
        and kept. ``paths``: any path law of the continuations (its length is taken from it; a lossy rule's law
        is replaced by the target's)."""
        return max(self.noise_by_shape(prompt, cfg, max((len(k) for k in paths), default=0)).values())

    def noise_by_shape(self, prompt: str, cfg: SamplingConfig, length: int) -> dict[str, float]:
        """TV between the computed law and the law under each of these batch shapes, every one from an empty
        cache so that the value depends on the tokens alone: ``whole path`` (one forward over prompt + path),
        ``one token per step`` (the prompt, then one token per forward, as an engine decodes) and ``beside other
        rows`` (every prefix of the law as a row of one batch, as a server batches requests: quantized llama.cpp
        kernels batching the rows together moved a law by TV up to 0.019 this way, while a row alone moved by 0).
        An engine's law is a mixture over the shapes it ran, and TV is convex, so its distance from the reference
        is at most the largest distance of those shapes."""
        key = (prompt, length, cfg, json.dumps(self.response_format, sort_keys=True))
        if key in self.noise:
            return self.noise[key]
        prompt_ids = list(self.encode(prompt))
        paths = self.paths(prompt_ids, cfg, length)
        def prob(path: tuple[int, ...], logits_at: Callable[[int], torch.Tensor]) -> float:
            out = 1.0
            for i, tok in enumerate(path):
                raw = self._restricted(logits_at(i).to(torch.float64), list(path[:i]))
                hist = History.of(prompt_ids, list(path[:i]), raw.shape[-1]) if cfg.uses_history else None
                out *= float(process(raw, cfg, hist)[tok])
            return out

        def whole(path: tuple[int, ...]) -> float:
            logits = self._score_fresh(prompt_ids, list(path[:-1]))
            return prob(path, lambda i: logits[i])

        def stepwise(path: tuple[int, ...]) -> float:
            self._fresh_rows()
            steps = [prompt_ids + list(path[:i]) for i in range(len(path))]
            return prob(path, lambda i: self.backend.score([ScoreRequest(self.row, steps[i])])[0][0])

        batched: dict[tuple[int, ...], torch.Tensor] = {}

        def beside(path: tuple[int, ...]) -> float:
            # every prefix of the law as a row of one forward (chunks of max_rows), so each row has neighbours of
            # other lengths; a chunk of one row gets the prompt's first half as its neighbour
            if not batched:
                prefixes = sorted({p[:i] for p in paths for i in range(len(p))}, key=lambda t: (len(t), t))
                for start in range(0, len(prefixes), self.max_rows):
                    chunk = [prompt_ids + list(pre) for pre in prefixes[start:start + self.max_rows]]
                    extra = [prompt_ids[:max(1, len(prompt_ids) // 2)]] if len(chunk) == 1 else []
                    rows = self._fresh_rows(len(chunk) + len(extra))
                    outs = self.backend.score([ScoreRequest(r, ids) for r, ids in zip(rows, chunk + extra,
                                                                                      strict=True)])
                    batched.update(zip(prefixes[start:start + self.max_rows], (o[0] for o in outs), strict=False))
            return prob(path, lambda i: batched[path[:i]])

        shapes = {"whole path": whole, "one token per step": stepwise}
        if self.max_rows > 1:
            shapes["beside other rows"] = beside
        result = {}
        for name, fn in shapes.items():
            other = {path: fn(path) for path in paths}
            total = sum(other.values())
            result[name] = (0.5 * sum(abs(paths[k] - other[k] / max(total, 1e-300)) for k in paths)
                            + 0.5 * abs(1 - total))
        self._fresh_rows()
        self.noise[key] = result
        return result

    def piece(self, tok: int) -> str:
        """One token's own decoding (what an endpoint's logprobs call it)."""
        return self.decode((tok,))

    def close(self) -> None:
        try:
            self.backend.remove_row(self.row)
        except Exception:  # noqa: BLE001 - releasing is best effort
            pass


class UrlReference:
    """The law read from an endpoint's top logprobs, one request per prefix (``max_tokens`` 1, ``logprobs`` 20).
    ``logprobs``: "processed", "raw" or "auto" (processed when the reported probabilities of the kept tokens sum
    to 1 within 1e-3 and, under top_k, no more than top_k tokens are reported)."""

    kind = "url"
    TOP = 20

    def __init__(self, client: EngineClient, logprobs: str = "auto") -> None:
        self.client, self.mode = client, logprobs
        self.logprobs_kind: str | None = None if logprobs == "auto" else logprobs
        self.name = f"{client.base} ({client.model})"
        self.cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
        self.ties: list[tuple[tuple, float]] = []
        self.tie_gap = TIE_GAP

    def _top(self, prompt: str, pieces: tuple[str, ...], cfg: SamplingConfig) -> dict[str, float]:
        key = (prompt, pieces)
        if key in self.cache:
            return self.cache[key]
        fields: dict[str, Any] = {"max_tokens": 1, "temperature": cfg.temperature, "logprobs": self.TOP, "seed": 0}
        for opt in options("sampling"):  # every sampling option of the request schema that is set, by its field
            value = getattr(cfg, opt.name)
            if opt.name == "temperature" or value == opt.default or opt.field is None:
                continue
            fields[opt.field] = {str(t): b for t, b in value} if opt.name == "logit_bias" else value
        out = self.client.complete(prompt + "".join(pieces), **fields)
        lp = out["choices"][0].get("logprobs")
        top = (lp or {}).get("top_logprobs") if isinstance(lp, dict) else None
        if not top or not isinstance(top[0], dict):
            raise AuditInputError(f"the reference endpoint {self.client.base} returned no top logprobs for "
                                  f"`logprobs: {self.TOP}` (field `logprobs` missing): give --reference-model instead "
                                  f"(exact), or add --two-sample to sample the endpoint and compare the two samples "
                                  f"(approximate)")
        entries = {str(k): float(v) for k, v in top[0].items() if v is not None}
        self.cache[key] = entries
        return entries

    def dist(self, prompt: str, pieces: tuple[str, ...], cfg: SamplingConfig) -> dict[str, float]:
        """The processed next-token law after ``prompt + pieces`` over token texts."""
        top = self._top(prompt, pieces, cfg)
        finite = {k: v for k, v in top.items() if v > -1000 and math.isfinite(v)}
        total = sum(math.exp(v) for v in finite.values())
        if self.logprobs_kind is None:
            # a processed law under top_k keeps at most top_k tokens: more finite entries are raw whatever their sum
            # (a peaked raw law's top 20 can sum to within 1e-3 of 1)
            beyond_k = cfg.top_k is not None and len(finite) > cfg.top_k
            self.logprobs_kind = "processed" if abs(total - 1.0) < 1e-3 and not beyond_k else "raw"
        if self.logprobs_kind == "processed":
            if abs(total - 1.0) > 1e-3:
                raise AuditInputError(f"the reference's logprobs after {pieces!r} sum to {total:.4f} over its top "
                                      f"{self.TOP}: the processed law keeps more than {self.TOP} tokens; lower "
                                      f"--top-k or give --reference-model")
            return {k: math.exp(v) / total for k, v in finite.items()}
        if cfg.top_k is None or cfg.top_k > self.TOP or cfg.uses_history or cfg.logit_bias:
            raise AuditInputError(f"the reference endpoint reports raw logprobs: the audit can process them only "
                                  f"with --top-k <= {self.TOP} and no penalties or logit_bias; give "
                                  f"--reference-model instead")
        kept = sorted(finite.items(), key=lambda kv: -kv[1])
        if len(kept) > cfg.top_k and kept[cfg.top_k - 1][1] - kept[cfg.top_k][1] < self.tie_gap:
            self.ties.append((pieces, kept[cfg.top_k - 1][1] - kept[cfg.top_k][1]))
        kept = kept[: cfg.top_k]
        w = [math.exp((v - kept[0][1]) / cfg.temperature) for _, v in kept]
        probs = {k: x / sum(w) for (k, _), x in zip(kept, w, strict=True)}
        if cfg.top_p is not None and cfg.top_p < 1 or cfg.min_p:
            raise AuditInputError("raw reference logprobs with top_p / min_p: give --reference-model instead")
        return probs

    def law(self, prompt: str, cfg: SamplingConfig, length: int, rule: _rules.Rule | None = None, gamma: int = 0,
            verifier: str = "token") -> tuple[dict[Outcome, float], dict[tuple, float]]:
        """(outcome law, path law over token texts) of the continuations of ``prompt`` (lossless only)."""
        if rule is not None and not rule.lossless:
            raise AuditInputError("a declared lossy rule's law needs the models: give --reference-model and "
                                  "--reference-draft (--reference-url gives the target's law only)")
        paths: dict[tuple, float] = {}

        def walk(pieces: tuple[str, ...], prob: float) -> None:
            if len(pieces) == length or (pieces and pieces[-1] in EOS_PIECES):
                paths[pieces] = paths.get(pieces, 0.0) + prob
                return
            for tok, pr in self.dist(prompt, pieces, cfg).items():
                if pr > 0:
                    walk(pieces + (tok,), prob * pr)

        walk((), 1.0)
        return fold(paths, lambda t: t in EOS_PIECES, "".join), paths

    def noise_tv(self, prompt: str, cfg: SamplingConfig, paths: dict[tuple, float]) -> float:
        """No second numerical path is available through an endpoint: 0 (the floor of the tolerance applies)."""
        return 0.0

    def piece(self, tok: str) -> str:
        return tok

    def close(self) -> None:
        pass
