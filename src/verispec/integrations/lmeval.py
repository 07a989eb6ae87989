"""verispec as an lm-evaluation-harness model: ``lm_eval --model verispec --model_args rule=lenience,l=0.5 ...``.

The stock ``lm_eval`` command finds the name because verispec's ``verispec-hook.pth`` registers it when lm-eval's
model registry loads (``_verispec_hook``); this module is imported only when a run asks for the model.

- ``generate_until``: speculative decoding under the requested rule, batched by the engine (``batch_size`` rows
  at a time). The task's ``gen_kwargs`` win over ``--model_args``, which win over lm-eval's default (greedy, as
  its HF model): ``do_sample=False`` means temperature 0, ``until`` are stop strings (an empty one stops nothing),
  ``max_gen_toks`` (or lm-eval's aliases ``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``) the token
  limit (256 by default). Request i of a call (its position in the list lm-eval passes) samples with seed
  (base + i) mod 2**63, base being its ``seed`` (the task's gen_kwargs, else the model argument), else one number
  drawn per call from torch's global generator, which lm-eval's ``--seed`` seeds: the copies of a sampled request
  that a task's ``repeats`` makes differ, and a rerun with the same ``--seed`` gives the same samples.
- ``loglikelihood`` / ``loglikelihood_rolling``: the target's own log-probabilities (temperature 1, no
  processors), scored in batched forwards; exact and independent of the rule, as lm-eval's HF model computes
  them: context and continuation encoded as its ``_encode_pair`` does; an empty context conditions on the prefix
  token (BOS, else EOS), or on the continuation's first token where that is the prefix token; an input longer
  than the context keeps its last ``max_length`` + 1 tokens (the target's context), scoring at most
  ``max_length``; long texts are scored in lm-eval's rolling windows of ``max_length`` tokens.
- Per task: block efficiency (emitted accepted drafts per target step, the bonus excluded), the accepted fraction
  of drafted tokens and the tokens per target step, logged when each generation batch ends and returned by
  :meth:`VerispecLM.get_model_info`, which lm-eval writes into its results' ``config``.

``--model_args`` keys: the engine's (``target`` or ``pretrained``, ``draft``, ``drafter``, ``dtype``, ``threads``,
``target_backend``, ``deterministic`` (true by default on the llama.cpp target: every row on model backends of its
own, so that scores and samples do not depend on ``--batch_size``; false batches rows in one forward, faster for
generation, and llama.cpp's quantized kernels then move log-likelihoods with the batch shape), ``draft_p_min``,
``max_rows``), the request schema's sampling options
(``temperature``, ``top_p``, ``top_k``, ``min_p``, ``eta``, the penalties) and ``rule``, ``gamma``, ``seed``,
``verifier``, ``greedy_lossy``, and the rule's own parameters (``l=0.5`` for lenience). Any other key is refused
with a ValueError naming it. lm-eval's argument parser reads ``none`` as None: ``drafter=none`` and a rule's
``draft_truncation=none`` mean the string, ``threads`` and the nullable sampling options take None, and any other
key refuses it with a ValueError naming the key.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from verispec.api import load_engine
from verispec.core import rules
from verispec.defaults import (
    AUTO,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DRAFT,
    DEFAULT_DTYPE,
    DEFAULT_RULE,
    DEFAULT_TARGET,
    MAX_SEED,
    drafter_spec,
    resolve_backends,
)
from verispec.options import OPTIONS
from verispec.runtime.types import Metrics

__all__ = ["VerispecLM"]

log = logging.getLogger(__name__)

#: lm-eval's default generation length (its HF model's ``max_gen_toks``)
MAX_GEN_TOKS = 256
#: the generation length's names in a task's gen_kwargs, in lm-eval's order of priority
_MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
_ENGINE_KEYS = ("target", "draft", "drafter", "dtype", "threads", "target_backend", "deterministic",
                "draft_p_min", "max_rows")
#: request-schema options a model argument may set for every generation (the rest are per request or structured)
_REQUEST_KEYS = ("rule", "gamma", "seed", "verifier", "greedy_lossy")
_SAMPLING_KEYS = tuple(o.name for o in OPTIONS.values() if o.group == "sampling" and o.name != "logit_bias")
#: lm-eval's own arguments that say nothing to a CPU engine that batches by itself
_IGNORED = ("max_batch_size",)
#: engine keys whose None (lm-eval's reading of "none") means something: the drafter "none"; load_engine's
#: default thread count
_ENGINE_NONE = {"drafter": "none", "threads": None}


class VerispecLM(LM):
    """An lm-eval model backed by a verispec :class:`~verispec.runtime.engine.Engine` (see the module docstring)."""

    def __init__(self, batch_size: int | str | None = None, device: str = "cpu", **model_args: Any) -> None:
        super().__init__()
        for key in _IGNORED:
            model_args.pop(key, None)
        if "pretrained" in model_args:  # among model_args, so that "pretrained=none" is told from no pretrained
            if "target" in model_args:
                raise ValueError("model_args: give target or pretrained, not both")
            model_args["target"] = _engine_arg("pretrained", model_args.pop("pretrained"))
        engine_args = {k: _engine_arg(k, model_args.pop(k)) for k in _ENGINE_KEYS if k in model_args}
        self.request = {k: OPTIONS[k].check(model_args.pop(k)) for k in _REQUEST_KEYS + _SAMPLING_KEYS
                        if k in model_args}
        rule_name = self.request.pop("rule", DEFAULT_RULE)
        _rule_nones(rule_name, model_args)
        try:
            self.rule = rules.get(rule_name, **model_args)  # the rest must be the rule's parameters
        except ValueError as exc:
            known = ", ".join(("pretrained",) + _ENGINE_KEYS + _REQUEST_KEYS + _SAMPLING_KEYS)
            raise ValueError(f"model_args: {exc} (engine and request keys: {known})") from None
        self.rule_args = {"rule": rule_name, **model_args}
        self.batch_size = _batch_size(batch_size)
        if device.startswith("cuda") and not torch.cuda.is_available():
            # lm-eval passes its --device default (cuda:0) to every model; its HF model falls back the same way
            log.warning("no CUDA device: verispec runs on the CPU")
            device = "cpu"
        target = engine_args.pop("target", DEFAULT_TARGET)
        target_backend, drafter = resolve_backends(engine_args.pop("target_backend", AUTO),
                                                   engine_args.pop("drafter", AUTO), device)
        # on llama.cpp, scores and samples that do not depend on --batch_size: every row on backends of its own
        # (batched, its quantized kernels move log-likelihoods with the batch shape by tenths of a nat; a float
        # transformers target moves them by float noise, and batching is what a GPU is for)
        engine_args.setdefault("deterministic", target_backend == "llamacpp")
        draft = engine_args.pop("draft", DEFAULT_DRAFT)
        self.engine = load_engine(target, draft if drafter_spec(drafter).uses_draft_model else None, drafter,
                                  engine_args.pop("dtype", DEFAULT_DTYPE), device=device,
                                  target_backend=target_backend, **engine_args)
        self.target_name = str(target)
        self.tokenizer = self.engine.tokenizer
        self._device = device
        self.per_task: dict[str, Metrics] = defaultdict(Metrics)

    # -- tokens --------------------------------------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        """The most tokens the model conditions on: one less than the target's context, since a scored window
        (lm-eval's HF model feeds ``max_length`` tokens and scores the next) is fed to the target whole, its last
        token included."""
        return int(self.engine.target.max_context) - 1

    @property
    def prefix_token_id(self) -> int:
        """What an empty context conditions on (lm-eval's HF model: BOS, else EOS)."""
        tok = self.tokenizer
        return int(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)

    def tok_encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: trailing spaces of the context move to the continuation; the context's tokens are its
        own encoding, the continuation's those of the whole text after as many tokens (where a token merges across
        the boundary, lm-eval's HF model scores the same ids)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation = context[-spaces:] + continuation
            context = context[:-spaces]
        whole = self.tok_encode(context + continuation)
        context_ids = self.tok_encode(context)
        return context_ids, whole[len(context_ids):]

    def _encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """A loglikelihood request's ids, as lm-eval's ``loglikelihood``: an empty context conditions on the prefix
        token, or on the continuation's first token where that is the prefix token."""
        if context:
            return self._encode_pair(context, continuation)
        cont = self.tok_encode(continuation)
        if cont and cont[0] == self.prefix_token_id:
            return cont[:1], cont[1:]
        return [self.prefix_token_id], cont

    # -- log-likelihoods -------------------------------------------------------------------------------------------
    def _score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of the continuation's log-probabilities and whether it is the greedy one, per (context, continuation)
        pair of token ids. As lm-eval's HF model, a sequence is cut on the left to its last ``max_length`` + 1 tokens,
        of which at most ``max_length`` are scored, each conditioned on up to ``max_length`` tokens."""
        seqs, spans = [], []
        for context, cont in pairs:
            ids = (context or [self.prefix_token_id]) + cont  # a context of spaces only encodes to nothing
            ids = ids[-(self.max_length + 1):]
            seqs.append(ids)
            spans.append(min(len(cont), len(ids) - 1))
        out = []
        for first in range(0, len(seqs), self.batch_size):
            chunk = seqs[first : first + self.batch_size]
            scored = self.engine.prompt_logprobs_batch(chunk, top=1)
            for lps, n in zip(scored, spans[first : first + self.batch_size], strict=True):
                tail = lps[len(lps) - n:] if n else []
                out.append((float(sum(t.logprob for t in tail)),
                            all(t.top and t.top[0][0] == t.token for t in tail)))
        return out

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._encode_request(*r.args) for r in requests]
        results = self._score(pairs)
        for r, res in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        out = []
        for r in requests:
            (text,) = r.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            # each window is (context, continuation); its first context is the prefix token itself
            pairs = [(list(ctx), list(cont)) for ctx, cont in windows]
            total = sum(lp for lp, _ in self._score(pairs))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # -- generation ------------------------------------------------------------------------------------------------
    def _settings(self, gen_kwargs: dict) -> dict:
        """One request's options: the task's gen_kwargs over the model arguments over greedy decoding."""
        kw = dict(gen_kwargs)
        until = kw.pop("until", None)
        # an empty stop string stops nothing (lm-eval's HF model skips it; the request schema refuses it)
        stop = [s for s in ([until] if isinstance(until, str) else list(until or [])) if s != ""]
        # the token limit and its aliases, first given by lm-eval's priority (its normalize_gen_kwargs')
        limits = [kw.pop(k, None) for k in _MAX_TOKEN_KEYS]
        max_gen = int(next((v for v in limits if v is not None), MAX_GEN_TOKS))
        do_sample = kw.pop("do_sample", None)
        sampling = {k: v for k, v in self.request.items() if k in _SAMPLING_KEYS}
        sampling.setdefault("temperature", 0.0)
        for k in list(kw):
            if k in _SAMPLING_KEYS:
                sampling[k] = OPTIONS[k].check(kw.pop(k))
        speculative = kw.pop("speculative", None) or {}  # as in verispec serve's request bodies
        request = {k: v for k, v in self.request.items() if k not in _SAMPLING_KEYS}
        for k in [*_REQUEST_KEYS, *speculative]:
            if k in kw or k in speculative:
                if k not in _REQUEST_KEYS or k == "rule":
                    raise ValueError(f"generation argument {k!r}: the rule is a model argument")
                request[k] = OPTIONS[k].check(kw.pop(k) if k in kw else speculative[k])
        if do_sample is False:
            sampling["temperature"] = 0.0
        elif do_sample and sampling["temperature"] == 0.0:
            sampling["temperature"] = 1.0
        if kw:
            log.warning("verispec ignores the generation arguments %s", sorted(kw))
        return {"stop": stop, "max_new_tokens": max_gen, **sampling, **request}

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        settings = [self._settings(r.args[1]) for r in requests]
        seeds = _seeds([s.pop("seed", None) for s in settings])
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, s in enumerate(settings):
            groups[tuple(sorted((k, repr(v)) for k, v in s.items() if k != "stop"))].append(i)
        out: list[str] = [""] * len(requests)
        for idx in groups.values():
            first = settings[idx[0]]
            room = self.max_length - first["max_new_tokens"]
            prompts = [self._prompt_ids(requests[i].args[0], room) for i in idx]
            fixed = {k: v for k, v in first.items() if k != "stop"}
            results = self.engine.generate(prompts, rule=self.rule, batch_size=self.batch_size,
                                           stop=[settings[i]["stop"] for i in idx], seed=[seeds[i] for i in idx],
                                           **fixed)
            for i, res in zip(idx, results, strict=True):
                if res.finish_reason == "error":
                    raise ValueError(f"verispec could not generate for request {i}: {res.error}")
                out[i] = res.text
                self._count(getattr(requests[i], "task_name", None) or "all", res.metrics)
                self.cache_hook.add_partial("generate_until", requests[i].args, res.text)
        self._log()
        return out

    def _prompt_ids(self, context: str, room: int) -> list[int]:
        ids = self.tok_encode(context) or [self.prefix_token_id]
        return ids[-max(room, 1):]

    def _count(self, task: str, m: Metrics) -> None:
        t = self.per_task[task]
        for name in ("rounds", "drafted", "accepted", "emitted_accepted", "new_tokens"):
            setattr(t, name, getattr(t, name) + getattr(m, name))

    def speculation(self) -> dict[str, dict[str, float | int]]:
        """Per task: block efficiency, accepted fraction, tokens per target step and the counts behind them."""
        out = {}
        for task, m in sorted(self.per_task.items()):
            out[task] = {"block_efficiency": m.emitted_accepted / m.rounds if m.rounds else 0.0,
                         "accepted_fraction": m.accepted / m.drafted if m.drafted else 0.0,
                         "tokens_per_step": m.new_tokens / m.rounds if m.rounds else 0.0,
                         "target_steps": m.rounds, "drafted": m.drafted, "accepted": m.accepted,
                         "new_tokens": m.new_tokens}
        return out

    def _log(self) -> None:
        for task, s in self.speculation().items():
            log.warning("verispec %s on %s: BE %.3f, accepted %.3f of %d drafted, %.2f tokens per target step",
                        self.rule_args["rule"], task, s["block_efficiency"], s["accepted_fraction"],
                        s["drafted"], s["tokens_per_step"])

    def get_model_info(self) -> dict:
        """What lm-eval writes into its results' ``config``: the engine, the rule and per-task speculation."""
        return {"verispec": {"target": self.target_name, **self.engine.backends, **self.rule_args,
                             **{k: v for k, v in self.request.items()}, "speculation": self.speculation()}}

    # -- chat --------------------------------------------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return self.target_name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if chat_template is not False else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The target's chat template applied to lm-eval's messages (as lm-eval's HF model does)."""
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)


def _engine_arg(key: str, value: Any) -> Any:
    """An engine model argument; lm-eval's parser reads "none" as None, which only some keys take."""
    if value is not None:
        return value
    if key in _ENGINE_NONE:
        return _ENGINE_NONE[key]
    hint = " (drafter=none runs the target alone)" if key == "draft" else ""
    raise ValueError(f"model_args: {key} cannot be none{hint}")


def _rule_nones(rule_name: str, params: dict[str, Any]) -> None:
    """A rule parameter whose choices include "none" (and that takes no None) gets back the "none" that lm-eval's
    parser made None; any other None is left to the rule's own check, which names the parameter."""
    schema = rules.describe().get(rule_name, {}).get("params", {})
    for key, value in params.items():
        spec = schema.get(key, {})
        if value is None and not spec.get("nullable") and "none" in spec.get("enum", ()):
            params[key] = "none"


def _seeds(given: list[int | None]) -> list[int]:
    """Request i's seed: (base + i) mod 2**63, base its own seed where it has one, else one number drawn from
    torch's global generator (seeded by lm-eval's ``--seed``): copies of a request sample apart, reproducibly."""
    drawn = int(torch.randint(MAX_SEED - 1, ())) if None in given else 0
    return [((drawn if seed is None else seed) + i) % MAX_SEED for i, seed in enumerate(given)]


def _batch_size(value: int | str | None) -> int:
    """lm-eval's ``--batch_size``: a number, or "auto" / "auto:N" (verispec's default batch, which the engine
    caps at its own row limit)."""
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {value}")
    return size
