"""Sampling processors: logits -> the distribution actually sampled.

These define what "p" and "q" mean everywhere in verispec (tutorial section 2.1): the distributions
*after* temperature, truncation and penalties. The same :class:`SamplingConfig` is applied to the target
and to the draft, so that verification uses the pair that sampling used.

Fixed order (documented, the same as Hugging Face's processors then warpers; the bias first, as vLLM does):

0. ``logit_bias`` (the OpenAI field): a constant added to the logit of each listed token;
1. history penalties on logits: repetition (multiplicative, CTRL style), frequency, presence;
2. temperature (``0`` means greedy: the distribution is one-hot on the argmax);
3. top-k, 4. top-p (nucleus), 5. min-p (Eq. 5 of the lossy-verification paper),
6. eta (Eq. 6 of the lossy-verification paper).

Every truncation keeps at least the most probable token and renormalizes. All functions are pure and
batched over any leading dimensions, with the vocabulary last; none loops over the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from verispec.defaults import DEFAULT_TEMPERATURE, LOGIT_BIAS_LIMIT
from verispec.options import OPTIONS, OptionError, options

__all__ = [
    "LOGIT_BIAS_LIMIT",
    "SamplingConfig",
    "adjust_logits",
    "apply_penalties",
    "entropy",
    "eta_mask",
    "eta_threshold",
    "minp_mask",
    "probs_from_logits",
    "process",
    "renormalize_on",
    "top_k_mask",
    "top_p_mask",
]


@dataclass(frozen=True)
class SamplingConfig:
    """Parameters of the sampling distribution; identical for target and draft.

    ``temperature=0`` selects greedy decoding; the default is
    :data:`verispec.defaults.DEFAULT_TEMPERATURE`. ``min_p`` is ``p_base`` of Eq. 5; ``eta`` is the epsilon
    of Eq. 6 with ``eta_delta`` its delta (``None``: delta = epsilon, as in Eq. 28). ``logit_bias``: (token id,
    bias) pairs added to the logits before anything else (a dict is accepted and stored sorted); ids are checked
    against the vocabulary where the model is known (the engine).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    eta: float | None = None
    eta_delta: float | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        # the ranges and the words of every refusal: the request schema (verispec.options), as at every front door
        for opt in options("sampling"):
            value = getattr(self, opt.name)
            if opt.name == "logit_bias":
                if value is not None and not isinstance(value, dict):
                    _check_pairs(value)
                    value = dict(value)
                value = opt.check(value)
                value = tuple(sorted(value.items())) if value else None
            else:
                value = opt.check(value)
            object.__setattr__(self, opt.name, value)
        if self.eta_delta is not None and not self.eta_delta > 0:
            raise ValueError(f"eta_delta must be > 0, got {self.eta_delta}")

    @classmethod
    def of(cls, values: dict[str, object]) -> SamplingConfig:
        """The config of the request schema's "sampling" options in ``values`` (None: that option's default)."""
        return cls(**{k: (OPTIONS[k].default if v is None and not OPTIONS[k].nullable else v)
                      for k, v in values.items()})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        """True when the distribution depends on the token history (penalties)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def adjusts_logits(self) -> bool:
        """True when the logits are changed before temperature (a bias or a penalty): greedy's argmax then needs
        :func:`adjust_logits` too."""
        return self.logit_bias is not None or self.uses_history

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError naming the first ``logit_bias`` token outside [0, vocab_size)."""
        for tok, _ in self.logit_bias or ():
            if tok >= vocab_size:
                raise ValueError(f"logit_bias: token {tok} is outside the vocabulary [0, {vocab_size})")

    def with_(self, **changes: object) -> SamplingConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    def untempered(self) -> SamplingConfig:
        """The same penalties at temperature 1 without truncation: the models' own distributions, which the
        deterministic temperature-0 reading of a lossy rule compares
        (:func:`verispec.core.verify.chain.verify_greedy_rule`)."""
        # asked once per round on the temperature-0 paths: made (and its fields checked) once per config
        cached = self.__dict__.get("_untempered")
        if cached is None:
            cached = replace(self, temperature=1.0, top_k=None, top_p=None, min_p=None, eta=None, eta_delta=None)
            object.__setattr__(self, "_untempered", cached)
        return cached


def _check_pairs(pairs: object) -> None:
    """logit_bias given as (token id, bias) pairs: each id once."""
    seen = set()
    for tok, _ in pairs:  # type: ignore[attr-defined]
        if tok in seen:
            raise OptionError("logit_bias", f"logit_bias: token {tok} is given twice")
        seen.add(tok)


class History:
    """Token occurrence counts of a sequence's history, as the penalties need them.

    ``all`` counts prompt + generated tokens: the repetition penalty uses it, as Hugging Face's
    ``RepetitionPenaltyLogitsProcessor`` does. ``generated`` counts generated tokens only: the frequency and
    presence penalties use it, as the OpenAI API and vLLM define them. Both are [..., V] long tensors; a
    leading dimension holds one history per row (e.g. every prefix of a drafted block, :meth:`prefixes`).
    This is the one place penalty histories are built; the engine, drafters and estimator all use it.
    """

    __slots__ = ("all", "generated")

    def __init__(self, all_counts: torch.Tensor, generated: torch.Tensor) -> None:
        self.all, self.generated = all_counts, generated

    @classmethod
    def of(cls, prompt_ids: list[int], generated_ids: list[int], vocab_size: int) -> History:
        """The history of ``prompt_ids`` followed by ``generated_ids``."""
        h = cls(torch.zeros(vocab_size, dtype=torch.long), torch.zeros(vocab_size, dtype=torch.long))
        if prompt_ids:
            h.all.index_add_(0, torch.tensor(prompt_ids), torch.ones(len(prompt_ids), dtype=torch.long))
        h.extend(generated_ids)
        return h

    def extend(self, tokens: list[int]) -> None:
        """Count generated ``tokens`` in place."""
        for tok in tokens:
            self.all[..., tok] += 1
            self.generated[..., tok] += 1

    def extended(self, tokens: list[int]) -> History:
        """A copy with generated ``tokens`` counted (the history of a candidate path)."""
        out = History(self.all.clone(), self.generated.clone())
        out.extend(tokens)
        return out

    def prefixes(self, tokens: list[int] | torch.Tensor) -> History:
        """Histories of ``committed + tokens[:i]`` for i = 0..n, stacked as [n + 1, V] (one per block position)."""
        t = torch.as_tensor(tokens, dtype=torch.long)
        return History(history_counts(self.all, t), history_counts(self.generated, t))


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor | History, cfg: SamplingConfig) -> torch.Tensor:
    """Apply history penalties given per-token occurrence counts (same shape as ``logits``).

    Repetition penalty as in CTRL / Hugging Face, over prompt + generated tokens (``History.all``): a seen
    token's logit is divided by the penalty when positive and multiplied when negative. Frequency and presence
    penalties as in the OpenAI API / vLLM, over generated tokens only (``History.generated``):
    ``logit -= frequency * count + presence * [count > 0]``. A plain tensor of counts is used for both.
    """
    if not cfg.uses_history:
        return logits
    all_counts, gen = (counts.all, counts.generated) if isinstance(counts, History) else (counts, counts)
    out = logits
    if cfg.repetition_penalty != 1.0:
        pen = torch.where(out > 0, out / cfg.repetition_penalty, out * cfg.repetition_penalty)
        out = torch.where(all_counts > 0, pen, out)
    if cfg.frequency_penalty != 0.0 or cfg.presence_penalty != 0.0:
        g = gen.to(out.dtype)
        out = out - cfg.frequency_penalty * g - cfg.presence_penalty * (gen > 0).to(out.dtype)
    return out


def adjust_logits(logits: torch.Tensor, cfg: SamplingConfig, counts: torch.Tensor | History | None = None
                  ) -> torch.Tensor:
    """The logits every later step sees: ``logit_bias`` added, then the history penalties (when ``counts`` is
    given). Applied identically to target and draft, so greedy and sampled verification stay exact under it."""
    if cfg.logit_bias is not None:
        ids = torch.tensor([t for t, _ in cfg.logit_bias], device=logits.device)
        if int(ids.max()) >= logits.shape[-1]:
            raise ValueError(f"logit_bias: token {int(ids.max())} is outside the vocabulary [0, {logits.shape[-1]})")
        bias = torch.tensor([b for _, b in cfg.logit_bias], dtype=logits.dtype, device=logits.device)
        logits = logits.clone()
        logits[..., ids] += bias
    if counts is not None:
        logits = apply_penalties(logits, counts, cfg)
    return logits


def renormalize_on(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Restrict ``probs`` to the boolean set ``keep`` and renormalize (Eq. 4 of the paper)."""
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def _keep_argmax(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    top = torch.zeros_like(keep)
    top.scatter_(-1, probs.argmax(-1, keepdim=True), True)
    return keep | top


def top_k_mask(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Allowed set of top-k: tokens whose probability is at least the k-th largest (ties kept)."""
    k = min(k, probs.shape[-1])
    kth = probs.topk(k, dim=-1).values[..., -1:]
    return probs >= kth


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Allowed set of nucleus sampling: the smallest prefix of tokens sorted by probability with mass >= top_p.

    A token is kept when the mass strictly before it (in descending order) is below ``top_p``.
    """
    sorted_p, idx = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(-1, idx, keep_sorted)
    return _keep_argmax(probs, keep)


def minp_mask(probs: torch.Tensor, p_base: float) -> torch.Tensor:
    """Allowed set of min-p sampling, Eq. 5: {x : p(x) >= p_base * max_v p(v)}."""
    return probs >= p_base * probs.amax(-1, keepdim=True)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats, H(p) = -sum p log p, with 0 log 0 = 0."""
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(-1)


def eta_threshold(probs: torch.Tensor, epsilon: float, delta: float | None = None) -> torch.Tensor:
    """Threshold of eta-sampling, Eq. 6: min(epsilon, delta * exp(-H(p))); delta defaults to epsilon."""
    delta = epsilon if delta is None else delta
    thr = torch.clamp(delta * torch.exp(-entropy(probs)), max=epsilon)
    return thr.unsqueeze(-1)


def eta_mask(probs: torch.Tensor, epsilon: float, delta: float | None = None) -> torch.Tensor:
    """Allowed set of eta-sampling, Eq. 6, always keeping the argmax so the set is never empty."""
    return _keep_argmax(probs, probs >= eta_threshold(probs, epsilon, delta))


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Temperature + truncations on already-penalized logits -> normalized probabilities in ``dtype``.

    Greedy (temperature 0) gives the one-hot distribution on the argmax (first index on ties), which is what
    greedy decoding samples from.
    """
    if torch.isnan(logits).any():
        raise ValueError("NaN in logits: the model produced an invalid distribution")
    in_range = torch.finfo(logits.dtype).max
    logits = logits.to(dtype)
    if cfg.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # logits / T can overflow only where the logits' own range, divided by T, exceeds ``dtype``'s (model logits in
    # float32 or bfloat16: T below about 1e-270); only then is the result looked at again (no sync otherwise)
    may_overflow = in_range / cfg.temperature > torch.finfo(dtype).max
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    if may_overflow and bool(torch.isnan(probs).any()):  # it did: the same law, shifted before dividing
        probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / cfg.temperature, dim=-1)
    if cfg.top_k is not None:
        probs = renormalize_on(probs, top_k_mask(probs, cfg.top_k))
    if cfg.top_p is not None and cfg.top_p < 1:
        probs = renormalize_on(probs, top_p_mask(probs, cfg.top_p))
    if cfg.min_p is not None and cfg.min_p > 0:
        probs = renormalize_on(probs, minp_mask(probs, cfg.min_p))
    if cfg.eta is not None:
        probs = renormalize_on(probs, eta_mask(probs, cfg.eta, cfg.eta_delta))
    return probs


def process(
    logits: torch.Tensor,
    cfg: SamplingConfig,
    counts: torch.Tensor | History | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The full pipeline: :func:`adjust_logits` (bias, penalties with the :class:`History` of each row), then
    :func:`probs_from_logits`."""
    return probs_from_logits(adjust_logits(logits, cfg, counts), cfg, dtype)


def history_counts(base_counts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Occurrence counts for each candidate prefix of a draft block.

    ``base_counts`` [V] counts the committed history; ``tokens`` [n] are drafted tokens. Row i of the
    result [n + 1, V] counts the history ``committed + tokens[:i]``, which is what position i of the block
    conditions on. A loop over the block (not the vocabulary): n is the draft length.
    """
    n = int(tokens.shape[0])
    out = base_counts.unsqueeze(0).repeat(n + 1, 1)
    if n:
        inc = torch.zeros(n + 1, base_counts.shape[-1], dtype=base_counts.dtype, device=base_counts.device)
        rows = torch.arange(1, n + 1, device=tokens.device)
        inc[rows, tokens] = 1
        out += inc.cumsum(0)
    return out


__all__ += ["History", "history_counts"]
