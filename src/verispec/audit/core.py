"""``verispec.audit``: certify an engine's sampling (speculative or not) against the exact law of short
continuations, black-box, with stated power.

The engine is sampled through its OpenAI-compatible ``/v1/completions`` (seed, temperature, top_k, max_tokens;
``n`` choices per request where it honours them), N times per prompt with distinct seeds; the reference law comes
from :mod:`verispec.audit.reference`; the test is :mod:`verispec.audit.stats` (chi-square under the tolerance
null TV <= tau, its p-value, worst-case power and the smallest detectable TV). Verdict: ``fail`` when the null is
rejected at ``alpha``, else ``pass`` when the run could detect an average TV of ``target_tv`` with power >=
``power``, else ``underpowered``. Any error of the endpoints or the settings raises
:class:`~verispec.audit.client.AuditInputError` before a verdict (never one on partial data). Without reference
logprobs, ``two_sample`` hands the audit to :func:`audit_two_sample` (the reference endpoint sampled too, a
test of homogeneity of the two samples: approximate; the section "two-sample mode" below).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verispec.audit import stats
from verispec.audit.client import AuditInputError, EngineClient
from verispec.audit.inprocess import LLMClient
from verispec.audit.reference import ModelReference, Outcome, UrlReference
from verispec.audit.report import to_json, write_report
from verispec.core import rules as _rules
from verispec.core.sampling import SamplingConfig
from verispec.options import OPTIONS, OptionError

__all__ = ["AUTO_PROMPTS", "PILOT_N", "AuditReport", "SampledReference", "audit", "audit_two_sample",
           "choose_design", "request_fields"]

#: candidate prompts of the automatic design (completions of code and prose the coder pair continues diversely)
AUTO_PROMPTS = (
    "# Python 3\nprint(",
    "import os\nimport",
    "while True:\n    ",
    "for i in range(",
    "import numpy as np\nimport",
    "x = [1, 2, 3]\nprint(",
)
#: tolerance: tau = max(TAU_FLOOR, TAU_SAFETY x the measured float noise of the reference). The noise is the
#: largest TV over the batch shapes measured (ModelReference.noise_by_shape); an engine's law is a mixture over
#: the shapes it runs and TV is convex, so its distance is at most the largest shape's: the factor 2 covers
#: shapes not measured (more rows, longer neighbours).
TAU_FLOOR = 1e-3
TAU_SAFETY = 2.0
#: the automatic design prefers prompts whose reference law moves by at most this TV between batch shapes (a
#: float32 transformers reference: about 1e-7; quantized llama.cpp kernels batching rows together: 0.002-0.02)
NOISE_MAX = 1e-4
#: the automatic design's sampling settings, tried in order (length, top_k, temperature)
AUTO_SETTINGS = ((2, 2, 1.0), (3, 2, 1.0), (2, 3, 1.0))


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[audit] {msg}", file=sys.stderr, flush=True)


@dataclass
class AuditReport:
    """Everything an audit found; ``verdict`` is pass / fail / underpowered. :meth:`as_dict` gives the values as
    they are (a smallest detectable TV no N reaches is ``inf``), :meth:`as_json` the strict JSON report."""

    verdict: str
    engine: dict
    reference: dict
    settings: dict
    prompts: list[str]
    test: dict
    power: dict
    tv: dict
    n: dict
    seconds: dict
    outcomes: list[list[dict]] = field(default_factory=list)
    logprobs: dict | None = None
    acceptance: dict | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def as_json(self, **kwargs: Any) -> str:
        """The report as strict JSON (:func:`~verispec.audit.report.to_json`: a non-finite number is null)."""
        return to_json(self, **kwargs)

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "underpowered": 2}.get(self.verdict, 3)


def _cfg(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None,
         penalties: dict | None, logit_bias: dict | None) -> SamplingConfig:
    pen = dict(penalties or {})
    bias = {int(k): float(v) for k, v in (logit_bias or {}).items()} or None
    return SamplingConfig(temperature=temperature, top_k=top_k or None, top_p=top_p, min_p=min_p,
                          logit_bias=bias, **pen)


def request_fields(length: int, temperature: float, top_k: int | None, top_p: float | None, min_p: float | None,
                   penalties: dict | None, logit_bias: dict | None) -> dict[str, Any]:
    """The sampling fields of every audit request (top_k 0 / None: not sent). ``top_p`` is always sent, 1.0 when
    not audited: it is an OpenAI field every compatible server takes, and some default to less (llama-cpp-python's
    server: 0.95), which would audit another law than the reference's."""
    fields: dict[str, Any] = {"max_tokens": length, "temperature": temperature,
                              "top_p": top_p if top_p is not None else 1.0}
    if top_k:
        fields["top_k"] = top_k
    if min_p is not None:
        fields["min_p"] = min_p
    for name, value in (penalties or {}).items():
        fields[name] = value
    if logit_bias:
        fields["logit_bias"] = {str(k): v for k, v in logit_bias.items()}
    return fields


def _spread(law: dict[Outcome, float]) -> float:
    return 1.0 / sum(v * v for v in law.values())


def _settings(prompts: Sequence[str] | None, temperature: float | None, top_k: int | None,
              length: int | None, truncated: bool = False) -> tuple[bool, list[tuple[int, int, float]], list[str]]:
    """(fixed design?, the (length, top_k, temperature) settings to try, the candidate prompts): everything given
    fixes the design; nothing given (prompts included) tries :data:`AUTO_SETTINGS`, top-k included even where top-p
    or min-p is audited (without it the law to enumerate can be the whole nucleus over every position); a part
    given fills the rest with defaults (length 3, temperature 1, top-k 3, or none where top-p or min-p is audited,
    ``truncated``: that truncation is the one asked for, and a top-k on top of it could hide it)."""
    given = prompts is not None
    fixed = given and temperature is not None and top_k is not None and length is not None
    default_k = 0 if truncated else 3
    if not given and temperature is None and top_k is None and length is None:
        settings = list(AUTO_SETTINGS)
    else:
        settings = [(length or 3, top_k if top_k is not None else default_k,
                     temperature if temperature is not None else 1.0)]
    return fixed, settings, list(prompts) if prompts is not None else list(AUTO_PROMPTS)


def _check_inputs(prompts: Sequence[str] | None, logit_bias: dict | None) -> dict[int, float] | None:
    """Refused before any request: an empty prompt list (None, not [], asks for the automatic prompts) and a logit
    bias the request schema refuses (the check every front door runs). Returns the bias as token id -> number."""
    if prompts is not None and len(prompts) == 0:
        raise AuditInputError("--prompts: no prompt given (an empty file or list); give at least one, or leave "
                              "--prompts out to have them chosen automatically")
    try:
        return OPTIONS["logit_bias"].check(logit_bias, "--logit-bias", json_body=True)
    except OptionError as exc:
        raise AuditInputError(str(exc)) from None


def _prepare_out(out_dir: str | None) -> None:
    """The report directory, made before any request: one that cannot be made or written is found before the
    run, not after it."""
    if out_dir is None:
        return
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuditInputError(f"--out {out_dir}: the report directory cannot be made ({exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise AuditInputError(f"--out {out_dir}: the report directory is not writable")


def _write(report: AuditReport, out_dir: str) -> None:
    """The report files, or no verdict: a verdict whose report was asked for and not written is not given."""
    try:
        write_report(report, out_dir)
    except OSError as exc:
        raise AuditInputError(f"--out {out_dir}: the report could not be written ({exc})") from None


def choose_design(ref: Any, prompts: Sequence[str], settings: Sequence[tuple[int, int, float]], make_cfg: Callable,
                  rule: _rules.Rule | None, gamma: int, verifier: str, target_tv: float, alpha: float,
                  power: float, max_prompts: int = 2, quiet: bool = True) -> dict:
    """Pick (length, top_k, temperature) and up to ``max_prompts`` prompts whose reference laws are spread over
    several continuations (largest outcome <= 0.6, effective number of outcomes 1 / sum p^2 >= 3) and clear of
    top-k near-ties: of every setting, the design that needs the fewest samples (:func:`stats.plan`) for
    ``target_tv`` under its own tolerance (:func:`tolerance` of the chosen prompts' measured noise), so a
    numerically stable prompt wins over a noisy one. Returns the chosen laws and the plan."""
    best: dict | None = None
    for length, top_k, temperature in settings:
        cfg = make_cfg(temperature, top_k)
        good = []
        for prompt in prompts:
            ties_before = len(ref.ties)
            law, paths = ref.law(prompt, cfg, length, rule, gamma, verifier)
            if len(ref.ties) > ties_before:
                _say(f"skipping {prompt!r}: a near-tie at a truncation boundary (top-k, top-p or min-p)", quiet)
                del ref.ties[ties_before:]  # a skipped prompt's ties say nothing about the audited ones
                continue
            if max(law.values()) <= 0.6 and _spread(law) >= 3:
                noise = ref.noise_tv(prompt, cfg, paths)
                if noise > NOISE_MAX:
                    _say(f"{prompt!r}: the reference's law moves by TV {noise:.2g} with the batch shape", quiet)
                good.append((prompt, law, paths, noise))
        if not good:
            continue
        good.sort(key=lambda g: (max(g[3], NOISE_MAX), -_spread(g[1])))  # stable ones first, then by noise
        for j in range(1, min(max_prompts, len(good)) + 1):
            chosen = good[:j]
            n, _ = stats.plan([g[1] for g in chosen], target_tv, tolerance(max(g[3] for g in chosen)), alpha,
                              power)
            cand = {"length": length, "top_k": top_k, "temperature": temperature,
                    "chosen": [g[:3] for g in chosen], "n_per_prompt": n, "n_total": n * j}
            # one more prompt is worth up to 20% more samples (a defect may show in one context only)
            if best is None or cand["n_total"] < best["n_total"] * (1.2 if j > len(best["chosen"]) else 1.0):
                best = cand
    if best is None:
        raise AuditInputError("no candidate prompt has a reference law spread over several continuations at the "
                              "automatic settings: give --prompts, --temperature and --top-k")
    return best


def tolerance(noise: float) -> float:
    """tau of the null TV <= tau: max(:data:`TAU_FLOOR`, :data:`TAU_SAFETY` x the measured noise)."""
    return max(TAU_FLOOR, TAU_SAFETY * noise)


def _sample(client: EngineClient, prompts: list[str], n_per_prompt: int, fields: dict, per_request: int,
            seed: int, concurrency: int, deadline: float, quiet: bool, want_logprobs: bool,
            stop: threading.Event | None = None) -> tuple[list[list[Outcome]], list[list[dict]], list[dict], bool]:
    """The outcomes of each prompt in the order their requests were sent (requests interleaved over prompts, seeds
    ``seed + request index x per_request``; choice by choice within a request), the choices' logprobs, the
    ``verispec`` blocks, and whether the deadline (or ``stop``, set by another sampler's failure) cut the sampling
    short. The order is the requests', not their answers': how fast an answer comes may depend on what it says (an
    accepted draft is quicker), so only the former keeps a cut (:func:`_trim`) blind to the values."""
    jobs = []
    per = max(1, per_request)
    for i in range(0, n_per_prompt, per):
        for j in range(len(prompts)):
            jobs.append((j, min(per, n_per_prompt - i)))
    answers: list[list[Outcome] | None] = [None] * len(jobs)
    lps: list[list[dict]] = [[] for _ in prompts]
    extras: list[dict] = []
    lock, stop = threading.Lock(), (stop if stop is not None else threading.Event())
    done = [0]
    t0 = time.monotonic()
    last = [t0]

    def run(idx: int) -> None:
        if stop.is_set() or time.monotonic() > deadline:
            stop.set()
            return
        j, k = jobs[idx]
        body = dict(fields, seed=seed + idx * per)
        if k > 1:
            body["n"] = k
        if want_logprobs:
            body["logprobs"] = 0
        out = client.complete(prompts[j], **body)
        choices = out["choices"]
        if len(choices) != k:
            raise AuditInputError(f"the engine returned {len(choices)} choices for n = {k}: field `n` not honoured "
                                  f"(rerun with --per-request 1)")
        with lock:
            answers[idx] = [(ch["text"], ch.get("finish_reason") == "stop") for ch in choices]
            for ch in choices:
                if want_logprobs and isinstance(ch.get("logprobs"), dict):
                    lps[j].append(ch["logprobs"])
            if isinstance(out.get("verispec"), dict):
                extras.append(out["verispec"])
            done[0] += k
            now = time.monotonic()
            if now - last[0] > 10:
                last[0] = now
                rate = done[0] / (now - t0)
                left = len(prompts) * n_per_prompt - done[0]
                _say(f"sampled {done[0]} of {len(prompts) * n_per_prompt} ({rate:.1f}/s, about "
                     f"{left / max(rate, 1e-9):.0f} s left)", quiet)

    _run_all(run, len(jobs), concurrency, stop)
    arrived: list[list[Outcome]] = [[] for _ in prompts]
    for (j, _), got in zip(jobs, answers, strict=True):
        if got is None:  # cut: the requests kept are those sent before the first one unanswered
            break
        arrived[j].extend(got)
    return arrived, lps, extras, stop.is_set()


def _run_all(run: Callable[[int], None], n_jobs: int, concurrency: int, stop: threading.Event) -> None:
    """``run(0..n_jobs-1)`` on ``concurrency`` threads, or in the caller's thread when it is 1 (an in-process engine,
    vLLM's LLM, runs where it was built); the first exception sets ``stop`` (other samplers end too) and is raised."""
    if concurrency <= 1:
        try:
            for i in range(n_jobs):
                run(i)
        except BaseException:
            stop.set()
            raise
        return
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(run, i) for i in range(n_jobs)]
        try:
            for f in futures:
                f.result()
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            raise


def _trim(arrived: Sequence[Outcome], n: int) -> Counter:
    """The counts of a prompt's first ``n`` samples in arrival order (:func:`_sample`'s: the order their requests
    were sent). A run cut short keeps the same N for every prompt (and side) by dropping the last samples, whatever
    their values; dropping by value (say, the continuations seen last) would bias the sample, and a correct engine
    could fail."""
    return Counter(arrived[:n])


def _logprob_errors(ref: Any, prompts: list[str], cfg: SamplingConfig, lps: list[list[dict]],
                    paths: list[dict]) -> dict:
    """Largest |reported logprob - log p_reference| over every sampled token whose path the reference knows."""
    worst, checked, unmatched = 0.0, 0, 0
    for prompt, entries, law_paths in zip(prompts, lps, paths, strict=True):
        by_pieces = {tuple(ref.piece(t) for t in path): path for path in law_paths}
        for lp in entries:
            toks, vals = lp.get("tokens") or [], lp.get("token_logprobs") or []
            path = next((p for pieces, p in by_pieces.items() if tuple(pieces[: len(toks)]) == tuple(toks)), None)
            if path is None:
                unmatched += 1
                continue
            for i, v in enumerate(vals):
                if v is None:
                    continue
                if isinstance(ref, ModelReference):
                    ids = tuple(ref.encode(prompt))
                    dist = ref.dist_fn(ids, cfg)(ids + tuple(path[:i]))
                    pr = float(dist[path[i]])
                else:
                    pr = ref.dist(prompt, tuple(path[:i]), cfg).get(path[i], 0.0)
                err = abs(float(v) - (math.log(pr) if pr > 0 else -9999.0))
                worst, checked = max(worst, err), checked + 1
    return {"max_abs_error": worst, "tokens_checked": checked, "samples_unmatched": unmatched}


def _speculation_note(acceptance: dict | None, tokens: int) -> list[str]:
    """A note when the engine reports that it hardly speculated: the verdict then certifies mostly its plain
    sampling path (an engine that picks its own draft length may choose none for short requests)."""
    if not acceptance or tokens <= 0 or acceptance["drafted"] >= 0.1 * tokens:
        return []
    return [f"the engine reported {acceptance['drafted']} drafted tokens for about {tokens} generated: its "
            f"speculative path was hardly exercised; force speculation (--gamma) to certify it"]


def _acceptance(extras: list[dict]) -> dict | None:
    """The engine's reported drafts and acceptances, summed over every choice (a response with ``n`` choices
    carries ``per_choice`` metrics beside the first choice's)."""
    metrics = [m or {} for e in extras for m in (e.get("per_choice") or [e.get("metrics")])]
    drafted = sum(int(m.get("drafted") or 0) for m in metrics)
    accepted = sum(int(m.get("accepted") or 0) for m in metrics)
    per_pos: list[list[float]] = []
    for m in metrics:
        a = m.get("acceptance_per_position")
        if isinstance(a, list):
            per_pos.append([float(x) for x in a if x is not None])
    if not extras:
        return None
    width = max((len(a) for a in per_pos), default=0)
    profile = [float(np.mean([a[i] for a in per_pos if len(a) > i])) for i in range(width)]
    rules = sorted({str(e.get("rule")) for e in extras})
    return {"drafted": drafted, "accepted": accepted, "per_position": profile, "rules_reported": rules,
            "responses": len(extras)}


def audit(base_url: str | None, model: str, *, llm: Any = None, reference_model: str | None = None,
          reference_url: str | None = None, reference: Any = None, reference_model_name: str | None = None,
          reference_draft: str | None = None, reference_logprobs: str = "auto", api_key: str | None = None,
          prompts: Sequence[str] | None = None, alpha: float = 1e-4, target_tv: float = 0.05, power: float = 0.9,
          time_limit: float = 600.0, temperature: float | None = None, top_k: int | None = None,
          top_p: float | None = None, min_p: float | None = None, length: int | None = None,
          penalties: dict | None = None, logit_bias: dict | None = None, verification: dict | None = None,
          gamma: int | None = None, extra_body: dict | None = None, n: int | None = None, per_request: int = 8,
          concurrency: int = 8, seed: int = 0, tau: float | None = None, tie_gap: float | None = None,
          check_logprobs: bool = False, two_sample: bool = False, out_dir: str | None = None,
          threads: int | None = None, response_format: dict | None = None, reference_dtype: str = "float32",
          quiet: bool = False) -> AuditReport:
    """Audit the engine at ``base_url`` serving ``model`` (or, with ``base_url`` None, ``llm``: a running ``vllm.LLM``
    audited in process, :class:`~verispec.audit.inprocess.LLMClient`); see the module docstring. The reference is
    ``reference_model`` (a GGUF or registered name, llama.cpp; or an HF directory, transformers in ``reference_dtype``;
    with ``reference_draft`` for a declared lossy rule's law), ``reference_url`` (an endpoint of the same model without
    speculation, read through its top logprobs: ``reference_logprobs`` "auto", "processed" or "raw"), or a ready
    ``reference`` object (:class:`~verispec.audit.reference.ModelReference`). Unset (None) sampling settings and prompts
    are chosen automatically (:func:`choose_design`; an empty ``prompts`` is refused); ``n`` fixes the samples per
    prompt (default: planned for ``target_tv`` at ``power``). ``verification`` is sent in each request body and declares
    the rule whose law is audited (its exact induced law for a lossy rule, with ``gamma`` drafts per round); ``gamma``
    is sent as verispec's ``speculative: {"gamma": gamma}``; ``extra_body`` adds any other fields. ``tie_gap``: the
    logit gap at a truncation boundary (top-k, top-p or min-p) below which a prefix counts as a near-tie (default
    :data:`~verispec.audit.reference.TIE_GAP`): the automatic design skips such prompts, given prompts with one are
    refused. ``response_format`` (structured output, sent in every request): the law is the reference's restricted to
    the grammar (its logits masked before processing, as verispec's engine does), so a sample outside the grammar has
    probability 0 and fails the audit (``--reference-model`` only). ``two_sample`` (with ``reference_url``): no
    log-probabilities are read; the reference endpoint is sampled like the engine and the two samples are tested for
    homogeneity (:func:`audit_two_sample`: approximate, no exact law). With ``out_dir`` the report (markdown, JSON,
    figure) is written there (the directory is made before any request; a report that cannot be written is no
    verdict)."""
    t_start = time.monotonic()
    logit_bias = _check_inputs(prompts, logit_bias)
    if sum(x is not None for x in (reference_model, reference_url, reference)) != 1:
        raise AuditInputError("give exactly one reference: --reference-model (a GGUF or HF directory of the same "
                              "weights) or --reference-url (an endpoint of the same model without speculation)")
    if not 0 < alpha < 1 or not 0 < target_tv < 1 or not 0 < power < 1:
        raise AuditInputError("alpha, the target TV and the power must lie in (0, 1)")
    if two_sample and reference_url is None:
        raise AuditInputError("--two-sample samples a reference endpoint: give --reference-url (an endpoint of the "
                              "same model without speculation) instead of --reference-model")
    # the rule and its parameters; the rest of the object (verifier, logprobs mode) is the engine's business
    rule = (_rules.from_request({k: v for k, v in verification.items() if k in ("rule", "params")})
            if verification is not None else None)
    verifier = (verification or {}).get("verifier", "token")
    if rule is not None and not rule.lossless and gamma is None:
        raise AuditInputError("a declared lossy rule's law depends on the draft length: give --gamma")
    body_extra = dict(extra_body or {})
    if verification is not None:
        body_extra["verification"] = verification
    if gamma is not None:
        body_extra["speculative"] = {"gamma": gamma}
    if response_format is not None:
        if two_sample:
            raise AuditInputError("--response-format needs --reference-model (the grammar-restricted law is computed "
                                  "from the weights), not --two-sample")
        body_extra["response_format"] = dict(response_format)
    # a request that takes longer than the whole audit may is a hang, not a slow answer
    if (base_url is None) == (llm is None):
        raise AuditInputError("give the engine under test either as an endpoint (--base-url) or in process (llm)")
    engine: Any = (LLMClient(llm, model, extra_body=body_extra) if llm is not None else
                   EngineClient(base_url, model, api_key, timeout=max(60.0, min(600.0, time_limit)),
                                extra_body=body_extra))
    _prepare_out(out_dir)

    if two_sample:
        if rule is not None and not rule.lossless:
            raise AuditInputError("--two-sample compares with the reference endpoint's own (lossless) sampling: a "
                                  "declared lossy rule's law needs --reference-model and --reference-draft")
        if check_logprobs:
            raise AuditInputError("--check-logprobs needs a log-probability reference: drop it with --two-sample, "
                                  "or give --reference-model")
        return audit_two_sample(
            engine, EngineClient(reference_url, reference_model_name or model, api_key,  # type: ignore[arg-type]
                                 timeout=engine.timeout, role="reference"),
            prompts=prompts, alpha=alpha, target_tv=target_tv, power=power, time_limit=time_limit,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, length=length, penalties=penalties,
            logit_bias=logit_bias, n=n, per_request=per_request, concurrency=concurrency, seed=seed, tau=tau,
            out_dir=out_dir, quiet=quiet, t_start=t_start)

    if llm is None and reference is None:  # an endpoint that is down is found before the reference loads (minutes)
        engine.complete((prompts or AUTO_PROMPTS)[0], max_tokens=1, temperature=0)
    t_ref = time.monotonic()
    if reference is not None:
        ref = reference
    elif reference_model is not None:
        _say(f"loading the reference model {reference_model}", quiet)
        ref = ModelReference.load(reference_model, threads, draft=reference_draft, dtype=reference_dtype)
    else:
        ref = UrlReference(EngineClient(reference_url, reference_model_name or model, api_key,  # type: ignore[arg-type]
                                        role="reference"), reference_logprobs)

    if tie_gap is not None:
        ref.tie_gap = tie_gap
    if response_format is not None:
        if not isinstance(ref, ModelReference):
            raise AuditInputError("--response-format: the grammar-restricted law is computed from the weights: give "
                                  "--reference-model")
        ref.response_format = dict(response_format)
        if ref.draft is not None:  # the engine restricts q too, at every drafted prefix
            ref.draft.response_format = ref.response_format

    def make_cfg(t: float, k: int | None) -> SamplingConfig:
        return _cfg(t, k, top_p, min_p, penalties, logit_bias)

    fixed, settings, candidates = _settings(prompts, temperature, top_k, length, top_p is not None or min_p is not None)
    if fixed:
        cfg = make_cfg(settings[0][2], settings[0][1])
        chosen = [(p, *ref.law(p, cfg, settings[0][0], rule, gamma or 0, verifier)) for p in candidates]
        if ref.ties:
            raise AuditInputError(f"a near-tie at a truncation boundary (top-k, top-p or min-p; logit gap "
                                  f"{min(g for _, g in ref.ties):.3f} < {ref.tie_gap}): the engine's kernels may keep "
                                  f"another token there, so a verdict could be a false fail; pick another prompt, "
                                  f"--top-k or --top-p, or lower --tie-gap when "
                                  f"engine and reference run the same kernels")
        design = {"length": settings[0][0], "top_k": settings[0][1], "temperature": settings[0][2],
                  "chosen": chosen}
    else:
        _say("choosing prompts and settings (reference laws of the candidates)", quiet)
        design = choose_design(ref, candidates, settings, make_cfg, rule, gamma or 0, verifier, target_tv, alpha,
                               power, max_prompts=len(candidates) if prompts else 2, quiet=quiet)
    length, top_k_used, temp = design["length"], design["top_k"], design["temperature"]
    cfg = make_cfg(temp, top_k_used)
    chosen_prompts = [c[0] for c in design["chosen"]]
    laws = [c[1] for c in design["chosen"]]
    paths = [c[2] for c in design["chosen"]]
    noise = max(ref.noise_tv(p, cfg, pa) for p, pa in zip(chosen_prompts, paths, strict=True))
    tau_used = tau if tau is not None else tolerance(noise)
    n_needed, min_prob = stats.plan(laws, target_tv, tau_used, alpha, power)
    planned = int(n) if n is not None else n_needed
    unreachable = None
    if n is None and n_needed >= stats.N_MAX:
        unreachable = (f"no N up to {stats.N_MAX} per prompt detects TV {target_tv:g} with power {power:g} under tau "
                       f"{tau_used:.2g} (the reference's float noise x {TAU_SAFETY:g}): the verdict cannot be pass; a "
                       f"larger --tv, a prompt whose law moves less with the batch shape, or a float32 reference")
        _say(unreachable, quiet)
    ref_seconds = time.monotonic() - t_ref
    _say(f"design: {len(chosen_prompts)} prompt(s), {length} tokens, top_k {top_k_used}, T {temp}; "
         f"{planned} samples per prompt planned (tau {tau_used:.2g}, measured noise {noise:.2g})", quiet)

    fields = request_fields(length, temp, top_k_used, top_p, min_p, penalties, logit_bias)

    # probe: one request with every field the audit sends (n included), before anything is counted
    probe = engine.complete(chosen_prompts[0], **fields, seed=seed, n=min(per_request, planned))
    if len(probe["choices"]) != min(per_request, planned):
        per_request = 1
        _say("the engine ignores `n`: one choice per request", quiet)
    if check_logprobs:
        lp = engine.complete(chosen_prompts[0], **fields, seed=seed, logprobs=0)["choices"][0].get("logprobs")
        if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
            raise AuditInputError("the engine returned no `logprobs` for `logprobs: 0`: rerun without "
                                  "--check-logprobs")

    t_sample = time.monotonic()
    deadline = t_start + time_limit
    arrived, lps, extras, cut = _sample(engine, chosen_prompts, planned, fields, per_request, seed, concurrency,
                                        deadline, quiet, check_logprobs)
    sample_seconds = time.monotonic() - t_sample
    n_each = min(len(a) for a in arrived)
    counts = [_trim(a, n_each) for a in arrived]  # a cut run: the same N for every prompt
    if n_each == 0:
        raise AuditInputError(f"no sample arrived within --time-limit {time_limit:.0f} s: no verdict")

    # the test
    bins = [stats.make_bins(law, n_each, min_prob) for law in laws]
    x2 = sum(stats.pearson(b.observed(c), b.probs) for b, c in zip(bins, counts, strict=True))
    df = sum(b.df for b in bins)
    lam0 = stats.tolerance_noncentrality(bins, n_each, tau_used)
    impossible = [{k: v for k, v in c.items() if law.get(k, 0.0) <= 0} for c, law in zip(counts, laws, strict=True)]
    m_imp = sum(sum(d.values()) for d in impossible)
    n_total = n_each * len(laws)
    p_chi = stats.tolerant_pvalue(x2, df, lam0)
    p_imp = stats.impossible_pvalue(m_imp, n_total, tau_used)
    pvalue = stats.combined_pvalue(p_chi, p_imp)
    pooled = float(np.mean([b.pooled_mass for b in bins]))
    mdt = stats.min_detectable_tv(n_total, df, lam0, alpha / 2, power, pooled)
    pow_at = stats.worst_case_power(max(target_tv - pooled, 0.0), n_total, df, lam0, alpha / 2)
    tv_hat, tv_lo, tv_hi = stats.tv_estimate(counts, laws)
    if pvalue < alpha:
        verdict = "fail"
    elif mdt <= target_tv:
        verdict = "pass"
    else:
        verdict = "underpowered"

    outcomes = []
    for c, law in zip(counts, laws, strict=True):
        keys = sorted(set(law) | set(c), key=lambda k: (-law.get(k, 0.0), -c.get(k, 0)))
        outcomes.append([{"text": k[0], "ended": k[1], "count": int(c.get(k, 0)),
                          "observed": c.get(k, 0) / n_each, "expected": law.get(k, 0.0)} for k in keys])
    notes = []
    if unreachable:
        notes.append(unreachable)
    if cut:
        notes.append(f"--time-limit {time_limit:.0f} s reached after {n_each} of {planned} samples per prompt")
    if ref.ties:
        notes.append(f"{len(ref.ties)} near-tie(s) at a truncation boundary in the reference (logit gap < "
                     f"{ref.tie_gap:g}): float noise there can move mass between continuations")
    report = AuditReport(
        verdict=verdict,
        engine={"base_url": engine.base, "model": model, "fields": fields, "extra_body": body_extra},
        reference={"mode": ref.kind, "name": ref.name, "logprobs": ref.logprobs_kind,
                   "exact": ("exact for these weights (enumerated from the model's processed distributions)"
                             if ref.kind == "model" else
                             "read from the endpoint's top logprobs; exact when it re-tokenizes prompt + prefix "
                             "text into the same tokens and keeps at most 20 tokens per step")},
        settings={"length": length, "temperature": temp, "top_k": top_k_used, "top_p": top_p, "min_p": min_p,
                  "penalties": penalties or {}, "logit_bias": logit_bias or {},
                  "response_format": response_format,
                  "law": (f"{rule.name} induced law (gamma {gamma}, verifier {verifier})"
                          if rule is not None and not rule.lossless else "target law (lossless)")},
        prompts=chosen_prompts,
        test={"name": "chi-square goodness of fit under the tolerance null TV <= tau (noncentral), Bonferroni with "
                      "a binomial test of zero-probability continuations",
              "alpha": alpha, "tau": tau_used, "tau_measured_noise": noise,
              "noise_by_shape": ({p: ref.noise_by_shape(p, cfg, length) for p in chosen_prompts}
                                 if hasattr(ref, "noise_by_shape") else None),
              "lambda0": lam0, "df": df, "x2": x2,
              "p_chi_square": p_chi, "impossible_samples": m_imp, "p_impossible": p_imp, "pvalue": pvalue,
              "bins": [len(b.probs) for b in bins], "bin_floor": min_prob, "pooled_mass": pooled},
        power={"target_tv": target_tv, "power_goal": power, "power_at_target_tv": pow_at,
               "min_detectable_tv": mdt, "n_needed_per_prompt": n_needed},
        tv={"estimate": tv_hat, "ci95": [tv_lo, tv_hi]},
        n={"planned_per_prompt": planned, "per_prompt": n_each, "total": n_total, "per_request": per_request},
        seconds={"total": time.monotonic() - t_start, "reference": ref_seconds, "sampling": sample_seconds,
                 "samples_per_s": n_total / max(sample_seconds, 1e-9)},
        outcomes=outcomes,
        logprobs=_logprob_errors(ref, chosen_prompts, cfg, lps, paths) if check_logprobs else None,
        acceptance=(acceptance := _acceptance(extras)),
        notes=notes + _speculation_note(acceptance, n_total * length),
    )
    _say(f"verdict {verdict}: p = {pvalue:.3g} (alpha {alpha:g}), TV {tv_hat:.3f} [{tv_lo:.3f}, {tv_hi:.3f}], "
         f"N {n_total}, smallest TV detectable with power {power}: {mdt:.3f}", quiet)
    if out_dir is not None:
        _write(report, out_dir)
    return report


# -- two-sample mode ----------------------------------------------------------------------------------------------
# ``verispec audit --reference-url URL --two-sample``: no reference log-probabilities.
#
# For an endpoint of the same model without speculation that reports no logprobs (or whose logprobs should not be
# trusted), the reference law is not read but sampled: the same prompts with the same sampling fields go to the
# engine under test and to the reference endpoint, N times per prompt on each side with distinct seeds (the engine
# ``seed + i``, the reference after the engine's last seed, a pilot far beyond both), and the two count tables are
# tested for homogeneity (:func:`verispec.audit.stats.two_sample_test`: Pearson's chi-square over the outcomes
# seen, sparse ones pooled so every expected count is >= 5, under the tolerance null TV <= tau). Power: the
# noncentral chi-square bound at the least favourable alternative of each TV, computed from the run's bins (n_eff =
# N / 2: twice the samples per side of the one-sample test for the same power). Verdicts as in the log-probability
# modes. Approximate, unlike those modes: there is no exact law, only the reference endpoint's own sampling,
# trusted as it is; a pass says the engine is indistinguishable from it at the stated power. Given prompts and
# settings are used as they are; otherwise :func:`choose_design` picks them from a pilot sample of the reference
# endpoint (:class:`SampledReference`, :data:`PILOT_N` per candidate), which also plans N when ``n`` is not given.
# The pilot is never part of the test.

#: pilot samples per candidate (prompt, setting) on the reference endpoint: design and plan only, never tested
PILOT_N = 256
#: the pilot's seeds start here (plus --seed), far from the engine's and the reference's sampling seeds
PILOT_SEED_OFFSET = 1 << 30

APPROXIMATE = ("approximate: no exact law; the reference endpoint is sampled like the engine (same prompts and "
               "settings, distinct seeds) and the two samples are compared, so a pass means the engine is "
               "indistinguishable from that endpoint's own sampling at the stated power (which is trusted, not "
               "checked); the log-probability modes compare with an exact law")


class SampledReference:
    """A reference endpoint known by its samples: the "law" of a candidate design is the empirical law of a pilot
    sample (``pilot_n`` per prompt), for :func:`choose_design` and the plan only. No ties,
    no measured noise (nothing to measure without logprobs)."""

    kind = "two-sample"
    logprobs_kind = None

    def __init__(self, client: EngineClient, fields_for: Any, pilot_n: int, per_request: int, seed: int,
                 concurrency: int, deadline: float) -> None:
        self.client, self.fields_for, self.pilot_n = client, fields_for, pilot_n
        self.per_request, self.next_seed, self.concurrency, self.deadline = per_request, seed, concurrency, deadline
        self.name = f"{client.base} ({client.model})"
        self.ties: list = []
        self.tie_gap = 0.0
        self.pilots: dict[tuple, Counter] = {}

    def law(self, prompt: str, cfg: SamplingConfig, length: int, rule: Any = None, gamma: int = 0,
            verifier: str = "token") -> tuple[dict[Outcome, float], dict]:
        """(empirical outcome law of the pilot, no paths)."""
        key = (prompt, length, cfg.temperature, cfg.top_k)
        if key not in self.pilots:
            fields = self.fields_for(length, cfg.temperature, cfg.top_k)
            arrived, _, _, _ = _sample(self.client, [prompt], self.pilot_n, fields, self.per_request,
                                       self.next_seed, self.concurrency, self.deadline, True, False)
            self.next_seed += math.ceil(self.pilot_n / self.per_request) * self.per_request
            self.pilots[key] = Counter(arrived[0])
        c = self.pilots[key]
        total = sum(c.values())
        if total == 0:
            raise AuditInputError("no pilot sample of the reference endpoint arrived within --time-limit: give "
                                  "--samples, --prompts, --length, --top-k and --temperature, or more time")
        return {k: v / total for k, v in c.items()}, {}

    def noise_tv(self, prompt: str, cfg: SamplingConfig, paths: dict) -> float:
        return 0.0

    def close(self) -> None:
        pass


def _probe(client: EngineClient, prompt: str, fields: dict, seed: int, per_request: int, quiet: bool) -> int:
    """One request with every field the audit sends (``n`` included): the endpoint answers, and how many choices
    per request it gives (1 when it ignores ``n``)."""
    out = client.complete(prompt, **fields, seed=seed, n=per_request)
    if per_request > 1 and len(out["choices"]) != per_request:
        _say(f"the {client.role} endpoint ignores `n`: one choice per request", quiet)
        return 1
    return per_request


def audit_two_sample(engine: EngineClient, reference: EngineClient, *, prompts: Sequence[str] | None,
                     alpha: float, target_tv: float, power: float, time_limit: float, temperature: float | None,
                     top_k: int | None, top_p: float | None, min_p: float | None, length: int | None,
                     penalties: dict | None, logit_bias: dict | None, n: int | None, per_request: int,
                     concurrency: int, seed: int, tau: float | None, out_dir: str | None, quiet: bool,
                     t_start: float | None = None) -> AuditReport:
    """The two-sample audit of ``engine`` against the ``reference`` endpoint (the section's comment); the arguments are
    :func:`verispec.audit.audit`'s. Errors raise :class:`AuditInputError` before any verdict."""
    t_start = time.monotonic() if t_start is None else t_start
    deadline = t_start + time_limit
    logit_bias = _check_inputs(prompts, logit_bias)
    _prepare_out(out_dir)

    def fields_for(length_: int, temperature_: float, top_k_: int | None) -> dict[str, Any]:
        return request_fields(length_, temperature_, top_k_, top_p, min_p, penalties, logit_bias)

    def make_cfg(t: float, k: int | None) -> SamplingConfig:
        return _cfg(t, k, top_p, min_p, penalties, logit_bias)

    fixed, settings, candidates = _settings(prompts, temperature, top_k, length, top_p is not None or min_p is not None)
    tau_used = tau if tau is not None else TAU_FLOOR

    t_ref = time.monotonic()
    # the reference first: it must answer (and may ignore `n`) before a pilot or the design asks anything of it
    first_length, first_top_k, first_temperature = settings[0]
    ref_per = _probe(reference, candidates[0], fields_for(first_length, first_temperature, first_top_k), seed,
                     per_request, quiet)
    pilot = SampledReference(reference, fields_for, PILOT_N, ref_per, seed + PILOT_SEED_OFFSET, concurrency, deadline)
    if fixed:
        design = {"length": settings[0][0], "top_k": settings[0][1], "temperature": settings[0][2],
                  "chosen": [(p,) for p in candidates]}
    else:
        _say(f"choosing prompts and settings ({PILOT_N} pilot samples of the reference per candidate)", quiet)
        design = choose_design(pilot, candidates, settings, make_cfg, None, 0, "token", target_tv, alpha, power,
                               max_prompts=len(candidates) if prompts else 2, quiet=quiet)
    length_used, top_k_used, temp = design["length"], design["top_k"], design["temperature"]
    cfg = make_cfg(temp, top_k_used)
    chosen = [c[0] for c in design["chosen"]]
    n_needed = None
    if n is None:
        laws = [pilot.law(p, cfg, length_used)[0] for p in chosen]
        n_needed, _ = stats.plan(laws, target_tv, tau_used, alpha, power, two_sample=True)
    planned = int(n) if n is not None else int(n_needed)  # type: ignore[arg-type]
    ref_seconds = time.monotonic() - t_ref
    _say(f"two-sample design: {len(chosen)} prompt(s), {length_used} tokens, top_k {top_k_used}, T {temp}; "
         f"{planned} samples per prompt on each side (tau {tau_used:.2g})", quiet)

    fields = fields_for(length_used, temp, top_k_used)
    eng_per = _probe(engine, chosen[0], fields, seed, min(per_request, planned), quiet)
    ref_per = min(ref_per, max(1, min(per_request, planned)))
    # seeds: the engine from `seed` (as in the log-probability modes), the reference after its last one
    eng_span = len(chosen) * math.ceil(planned / eng_per) * eng_per
    ref_seed = seed + eng_span

    t_sample = time.monotonic()
    stop = threading.Event()
    _say("sampling the engine and the reference endpoint side by side", quiet)
    with ThreadPoolExecutor(2) as pool:
        fe = pool.submit(_sample, engine, chosen, planned, fields, eng_per, seed, concurrency, deadline, quiet, False,
                         stop)
        fr = pool.submit(_sample, reference, chosen, planned, fields, ref_per, ref_seed, concurrency, deadline, True,
                         False, stop)
        # the first failure on either side stops the other at once (no verdict on partial data)
        wait([fe, fr], return_when=FIRST_EXCEPTION)
        if fe.exception() is not None or fr.exception() is not None:
            stop.set()
        arrived_e, _, extras, cut_e = fe.result()
        arrived_r, _, _, cut_r = fr.result()
    sample_seconds = time.monotonic() - t_sample
    n_each = min(len(a) for a in arrived_e + arrived_r)
    if n_each == 0:
        raise AuditInputError(f"no sample arrived from both endpoints within --time-limit {time_limit:.0f} s: no "
                              f"verdict")
    # a cut run: the same N for every prompt on both sides, the samples of the last requests dropped
    counts_e = [_trim(a, n_each) for a in arrived_e]
    counts_r = [_trim(a, n_each) for a in arrived_r]

    st = stats.two_sample_test(counts_e, counts_r, tau_used, alpha, power, target_tv)
    tv_hat, tv_lo, tv_hi = stats.tv_two_sample(counts_e, counts_r, seed=seed)
    if st["pvalue"] < alpha:
        verdict = "fail"
    elif st["min_detectable_tv"] <= target_tv:
        verdict = "pass"
    else:
        verdict = "underpowered"

    outcomes = []
    for ce, cr in zip(counts_e, counts_r, strict=True):
        keys = sorted(set(ce) | set(cr), key=lambda k: (-cr.get(k, 0), -ce.get(k, 0), repr(k)))
        outcomes.append([{"text": k[0], "ended": k[1], "count": int(ce.get(k, 0)),
                          "reference_count": int(cr.get(k, 0)), "observed": ce.get(k, 0) / n_each,
                          "expected": cr.get(k, 0) / n_each} for k in keys])
    notes = [f"two-sample mode is {APPROXIMATE}"]
    if cut_e or cut_r:
        notes.append(f"--time-limit {time_limit:.0f} s reached after {n_each} of {planned} samples per prompt and "
                     f"side")
    n_total = n_each * len(chosen)
    report = AuditReport(
        verdict=verdict,
        engine={"base_url": engine.base, "model": engine.model, "fields": fields, "extra_body": engine.extra_body},
        reference={"mode": "two-sample", "name": f"{reference.base} ({reference.model})", "logprobs": None,
                   "exact": APPROXIMATE},
        settings={"length": length_used, "temperature": temp, "top_k": top_k_used, "top_p": top_p, "min_p": min_p,
                  "penalties": penalties or {}, "logit_bias": logit_bias or {},
                  "law": "target law (lossless), as the reference endpoint samples it"},
        prompts=chosen,
        test={"name": "chi-square test of homogeneity of the engine's and the reference endpoint's samples (2 x B "
                      "table per prompt, bins from the pooled counts, expected counts >= 5) under the tolerance "
                      "null TV <= tau (noncentral)",
              "alpha": alpha, "tau": tau_used, "lambda0": st["lambda0"], "df": st["df"], "x2": st["x2"],
              "p_chi_square": st["pvalue"], "pvalue": st["pvalue"], "bins": [len(b.probs) for b in st["bins"]],
              "bin_floor": st["bin_floor"], "pooled_mass": st["pooled_mass"], "n_eff": st["n_eff"]},
        power={"target_tv": target_tv, "power_goal": power, "power_at_target_tv": st["power_at_target_tv"],
               "min_detectable_tv": st["min_detectable_tv"], "n_needed_per_prompt": n_needed,
               "method": "noncentral chi-square approximation at the least favourable alternative of each TV "
                         "(Cauchy-Schwarz: noncentrality >= 4 n_eff TV^2, n_eff = N_engine N_reference / (N_engine "
                         "+ N_reference) per prompt), from the run's bins; computed, not simulated"},
        tv={"estimate": tv_hat, "ci95": [tv_lo, tv_hi],
            "method": f"plug-in TV between the two empirical laws (mean over prompts), basic bootstrap interval "
                      f"(2000 multinomial resamples of both sides, seed {seed})"},
        n={"planned_per_prompt": planned, "per_prompt": n_each, "total": n_total, "reference_total": n_total,
           "per_request": eng_per, "reference_per_request": ref_per,
           "pilot_per_prompt": PILOT_N if pilot.pilots else 0},
        seconds={"total": time.monotonic() - t_start, "reference": ref_seconds, "sampling": sample_seconds,
                 "samples_per_s": 2 * n_total / max(sample_seconds, 1e-9)},
        outcomes=outcomes,
        logprobs=None,
        acceptance=(acceptance := _acceptance(extras)),
        notes=notes + _speculation_note(acceptance, n_total * length_used),
    )
    _say(f"verdict {verdict}: p = {st['pvalue']:.3g} (alpha {alpha:g}), TV {tv_hat:.3f} [{tv_lo:.3f}, "
         f"{tv_hi:.3f}] between the two samples, N {n_total} per side, smallest TV detectable with power {power}: "
         f"{st['min_detectable_tv']:.3f} (two-sample: approximate)", quiet)
    if out_dir is not None:
        _write(report, out_dir)
    return report
