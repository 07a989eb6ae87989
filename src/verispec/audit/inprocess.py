"""The engine under test in process: a running ``vllm.LLM`` behind the audit's client interface.

The audit's requests (the ``/v1/completions`` fields it sends) become ``SamplingParams`` of one ``LLM.generate``
call each; the answers come back in the completion's shape (``choices`` with ``text`` and ``finish_reason``), and
vLLM's per-request speculative metrics, where the ``LLM`` was started with ``per_request_spec_decode_metrics``,
as the ``verispec`` block the audit reads acceptance from. vLLM fixes the draft length when the ``LLM`` starts,
so a ``speculative.gamma`` other than that is refused; a ``verification`` object goes to verispec's plug-in
(``extra_args``). Refusals become :class:`~verispec.audit.client.AuditInputError` naming the field.
"""

from __future__ import annotations

import threading
from typing import Any

from verispec.audit.client import AuditInputError

__all__ = ["LLMClient"]

#: completion fields that SamplingParams takes under the same name
_SAME = ("max_tokens", "n", "seed", "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
         "repetition_penalty")


class LLMClient:
    """``complete(prompt, **fields)`` on a ``vllm.LLM`` (one generate call at a time: ``LLM`` is not
    thread-safe, so send many choices per request, ``per_request``, rather than concurrent requests)."""

    role = "engine"

    def __init__(self, llm: Any, model: str | None = None, extra_body: dict | None = None) -> None:
        self.llm = llm
        self.model = model or "in-process vLLM"
        self.base = f"in process ({type(llm).__module__}.{type(llm).__name__})"
        self.extra_body = dict(extra_body or {})
        self.timeout = None
        spec = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "speculative_config", None)
        self.gamma = int(getattr(spec, "num_speculative_tokens", 0) or 0)
        self._lock = threading.Lock()

    def complete(self, prompt: str, **fields: Any) -> dict:
        """One request; the answer in the shape of an OpenAI completion, or :class:`AuditInputError`."""
        from vllm import SamplingParams

        body = {**self.extra_body, **fields}
        body.pop("model", None)
        spec = body.pop("speculative", None) or {}
        if spec.get("gamma") is not None and int(spec["gamma"]) != self.gamma:
            raise AuditInputError(f"the in-process vLLM engine drafts num_speculative_tokens = {self.gamma}, set when "
                                  f"its LLM started; the audit asks gamma {spec['gamma']} (drop --gamma, or give "
                                  f"{self.gamma})")
        if body.pop("logprobs", None) is not None:
            raise AuditInputError("the in-process audit reads no logprobs: drop --check-logprobs, or audit vLLM's "
                                  "OpenAI server with --base-url")
        verification = body.pop("verification", None)
        kw: dict[str, Any] = {k: body.pop(k) for k in list(body) if k in _SAME}
        top_k = body.pop("top_k", None)
        kw["top_k"] = int(top_k) if top_k else 0  # vLLM: 0 keeps every token
        bias = body.pop("logit_bias", None)
        if bias:
            kw["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
        if body:
            raise AuditInputError(f"the in-process vLLM engine has no field {sorted(body)[0]!r}: audit its OpenAI "
                                  f"server with --base-url instead")
        if verification is not None:
            kw["extra_args"] = {"verification": verification}
        try:
            params = SamplingParams(**kw)
            with self._lock:
                (out,) = self.llm.generate([prompt], params, use_tqdm=False)
        except (ValueError, TypeError) as exc:
            field = next((f for f in ("verification", *kw) if f in str(exc)), None)
            raise AuditInputError(f"the in-process vLLM engine refused the request"
                                  f"{f' (field {field!r})' if field else ''}: {exc}") from None
        choices = [{"index": i, "text": c.text, "finish_reason": c.finish_reason} for i, c in enumerate(out.outputs)]
        per_choice = []
        for c in out.outputs:
            sd = getattr(c, "spec_decode_metrics", None)
            drafted = sum(int(x) for x in (getattr(sd, "per_step_drafted", None) or []))
            accepted = sum(int(x) for x in (getattr(sd, "per_step_accepted", None) or []))
            per_choice.append({"drafted": drafted, "accepted": accepted} if sd is not None else {})
        rule = (verification or {}).get("rule", "vllm") if isinstance(verification, dict) else "vllm"
        block = {"rule": rule, "metrics": per_choice[0], "per_choice": per_choice} if any(per_choice) else None
        return {"choices": choices, "verispec": block}
