"""The patches the vLLM plug-in applies (imported only inside a process that runs vLLM; see the package docstring)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import torch
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from verispec.core import rules as _rules
from verispec.integrations.vllm import rule_of
from verispec.integrations.vllm.sampler import PLACEHOLDER, verify_requests

log = logging.getLogger(__name__)

class VerificationError(VLLMValidationError, ValueError):
    """A bad ``verification`` request: vLLM's validation error (400 from its server, with the field) and a
    ValueError (from ``LLM``)."""


#: sampling options whose effect on the bonus position the plug-in does not reproduce: refused with a rule
_REFUSED_WITH_A_RULE = ("logprobs", "prompt_logprobs")


def _check_params(params: SamplingParams) -> None:
    try:
        rule = rule_of(params.extra_args)
    except _rules.RequestError as exc:
        raise VerificationError(str(exc), parameter=exc.param) from None
    if rule is None:
        return
    for name in _REFUSED_WITH_A_RULE:
        if getattr(params, name, None) is not None:
            raise VerificationError(f"{name} is not supported together with a verification rule (the plug-in "
                                      "replaces vLLM's tokens after vLLM gathered their log-probabilities)",
                                      parameter=name)
    penalties = (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
                 or params.presence_penalty != 0.0)
    if penalties:
        raise VerificationError("penalties are not supported together with a verification rule yet (the bonus "
                                  "position's distribution would not include them)", parameter="verification")
    # applied by vLLM's sampler outside the rejection sampler's processed target (or at the bonus position only):
    # the plug-in's p would not include them, so a rule would verify against the wrong law
    for name, unset in (("min_p", 0.0), ("min_tokens", 0), ("logit_bias", None), ("allowed_token_ids", None),
                        ("bad_words", None)):
        if getattr(params, name, unset) not in (unset, [], {}):
            raise VerificationError(f"{name} is not supported together with a verification rule (vLLM applies "
                                      "it outside the distributions the plug-in verifies against)", parameter=name)


def _patch_validation() -> None:
    original = SamplingParams.verify

    def verify(self: SamplingParams, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _check_params(self)

    SamplingParams.verify = verify  # type: ignore[method-assign]


#: what a request with a rule is told where vLLM runs its V2 model runner, which the plug-in does not patch
V2_RUNNER_REFUSAL = ("verification rules run in vLLM's V1 model runner, and this engine runs the V2 one (vLLM's "
                     "default where Triton is available, e.g. on a GPU): start vLLM with VLLM_USE_V2_MODEL_RUNNER=0")


def _patch_input_processor() -> None:
    """Refuse a rule where the engine runs vLLM's V2 model runner: its sampling path (its own model runner and
    rejection sampler classes) is not patched, so the rule would be accepted and silently not applied."""
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params

    def _validate_params(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, params, *args, **kwargs)  # SamplingParams.verify: a bad rule is refused there
        v2 = bool(getattr(self.vllm_config, "use_v2_model_runner", False))
        if v2 and isinstance(params, SamplingParams) and rule_of(params.extra_args) is not None:
            raise VerificationError(V2_RUNNER_REFUSAL, parameter="verification")
        return out

    InputProcessor._validate_params = _validate_params  # type: ignore[method-assign]


def _patch_openai_requests() -> None:
    """A top-level ``verification`` field of an OpenAI request goes into ``extra_args``."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for cls in (ChatCompletionRequest, CompletionRequest):
        original = cls.to_sampling_params

        def to_sampling_params(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> SamplingParams:
            params = __original(self, *args, **kwargs)
            extra = getattr(self, "model_extra", None) or {}
            if "verification" in extra:
                params.extra_args = {**(params.extra_args or {}), "verification": extra["verification"]}
            return params

        cls.to_sampling_params = to_sampling_params  # type: ignore[method-assign]


def _patch_model_runner() -> None:
    original = GPUModelRunner._sample

    def _sample(self: GPUModelRunner, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        sampler = getattr(self, "rejection_sampler", None)
        if spec_decode_metadata is not None and sampler is not None:
            cache = self.__dict__.setdefault("_verispec_rule_cache", {})  # req_id -> rule, parsed once
            found = []
            for req_id in self.input_batch.req_ids:
                if req_id not in cache:
                    params = getattr(self.requests.get(req_id), "sampling_params", None)
                    try:
                        cache[req_id] = rule_of(params.extra_args) if params is not None else None
                    except ValueError:  # validated at the front end; never fail a step here
                        cache[req_id] = None
                found.append(cache[req_id])
            for gone in set(cache) - set(self.input_batch.req_ids):
                del cache[gone]
            sampler._verispec_rules = found if any(r is not None for r in found) else None
        return original(self, logits, spec_decode_metadata)

    GPUModelRunner._sample = _sample  # type: ignore[method-assign]


def _constrain(logits: torch.Tensor, per_row: torch.Tensor, sampling_metadata: Any) -> torch.Tensor:
    """Temperature (0 read as 1: greedy rows keep their untempered distribution), top-k and top-p, as vLLM's
    ``apply_sampling_constraints`` applies them, with each row's request index in ``per_row`` (plain torch)."""
    if sampling_metadata.all_greedy:
        return logits
    t = sampling_metadata.temperature[per_row].to(logits.dtype)
    logits = logits / torch.where(t == 0, torch.ones_like(t), t).unsqueeze(-1)
    top_k = sampling_metadata.top_k[per_row] if sampling_metadata.top_k is not None else None
    top_p = sampling_metadata.top_p[per_row] if sampling_metadata.top_p is not None else None
    return apply_top_k_top_p(logits, top_k, top_p)


def _processed_probs(sampler: rs.RejectionSampler, metadata: Any, logits: torch.Tensor,
                     sampling_metadata: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's processed target distributions at the drafted positions and at the bonus positions."""
    counts = torch.tensor(metadata.num_draft_tokens, device=logits.device)
    requests = torch.arange(len(metadata.num_draft_tokens), device=logits.device)
    target = logits[metadata.target_logits_indices].to(torch.float32)
    target = sampler.apply_logits_processors(target, sampling_metadata, metadata)
    target = _constrain(target, requests.repeat_interleave(counts), sampling_metadata)
    bonus = _constrain(logits[metadata.bonus_logits_indices].to(torch.float32), requests, sampling_metadata)
    return target.softmax(-1, dtype=torch.float32), bonus.softmax(-1, dtype=torch.float32)


class _StepStats:
    """Seconds per verify step in vLLM's own sampler and in the plug-in, written to ``$VERISPEC_VLLM_STATS.<pid>``
    (JSON, after every step) when that variable is set: how ``benchmarks/vllm_cpu.py`` prices the plug-in."""

    def __init__(self) -> None:
        base = os.environ.get("VERISPEC_VLLM_STATS")
        self.path = f"{base}.{os.getpid()}" if base else None
        self.totals = {"steps": 0, "vllm_sampler_s": 0.0, "verispec_s": 0.0}

    def add(self, vllm_s: float, verispec_s: float) -> None:
        t = self.totals
        t["steps"] += 1
        t["vllm_sampler_s"] += vllm_s
        t["verispec_s"] += verispec_s
        with open(self.path, "w") as f:  # type: ignore[arg-type]
            json.dump(t, f)


def _sampler_output(tokens: torch.Tensor) -> Any:
    from vllm.v1.outputs import SamplerOutput

    return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)


def _patch_rejection_sampler() -> None:
    original = rs.RejectionSampler.forward
    stats = _StepStats()
    clock = time.perf_counter

    def forward(self: rs.RejectionSampler, metadata: Any, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                sampling_metadata: Any) -> Any:
        found = getattr(self, "_verispec_rules", None)
        self._verispec_rules = None
        t0 = clock()
        if not found or len(found) != len(metadata.num_draft_tokens):
            out = original(self, metadata, draft_probs, logits, sampling_metadata)
            if stats.path:
                stats.add(clock() - t0, 0.0)
            return out
        if all(r is not None for r in found):
            # every row is the plug-in's: vLLM's own sampler need not run (no logprobs: refused with a rule)
            own, t1, kept = None, t0, logits
        else:
            kept = logits.clone()  # vLLM may update logits in place
            # vLLM's pass draws from every seeded row's generator; the plug-in's rows get their generators back as
            # they were, so a seeded request's tokens do not depend on whether the others of its batch have a rule
            gens = sampling_metadata.generators or {}
            saved = {i: g.get_state() for i, g in gens.items() if i < len(found) and found[i] is not None}
            own = original(self, metadata, draft_probs, logits, sampling_metadata)
            for i, state in saved.items():
                gens[i].set_state(state)
            t1 = clock()
        width = metadata.max_spec_len + 1  # vLLM's output layout
        tokens = (own.sampled_token_ids if own is not None else
                  torch.full((len(found), width), PLACEHOLDER, dtype=torch.int32, device=logits.device))
        try:
            target, bonus = _processed_probs(self, metadata, kept, sampling_metadata)
            if not (bool(torch.isfinite(target).all()) and bool(torch.isfinite(bonus).all())):
                raise ValueError(f"non-finite target distributions (rows of logits finite: "
                                 f"{bool(torch.isfinite(kept).all())}, draft probs finite: "
                                 f"{draft_probs is None or bool(torch.isfinite(draft_probs).all())})")
            if sampling_metadata.all_greedy:
                greedy = [True] * len(found)
            elif sampling_metadata.all_random or sampling_metadata.temperature is None:
                greedy = [False] * len(found)
            else:
                greedy = [bool(t == 0) for t in sampling_metadata.temperature.tolist()]
            verify_requests(found, metadata.draft_token_ids, metadata.num_draft_tokens, draft_probs, target, bonus,
                            greedy, sampling_metadata.generators, out=tokens)
        except Exception:  # never take other requests down: this step keeps vLLM's own tokens
            log.exception("verispec's verification failed for this step; vLLM's own result is kept")
            if own is None:
                own = original(self, metadata, draft_probs, kept, sampling_metadata)
            return own
        if stats.path:
            stats.add(t1 - t0, clock() - t1)
        return own if own is not None else _sampler_output(tokens)

    rs.RejectionSampler.forward = forward  # type: ignore[method-assign]


def apply() -> None:
    """Apply every patch (once per process; :func:`verispec.integrations.vllm.register` guards it)."""
    _patch_validation()
    _patch_input_processor()
    _patch_openai_requests()
    _patch_model_runner()
    _patch_rejection_sampler()
    log.info("verispec: per-request verification rules enabled in vLLM")
