"""``verispec.audit``: certify an engine's sampling (speculative or not) against the exact law of short
continuations, black-box, with stated power.

The engine is sampled through its OpenAI-compatible ``/v1/completions`` (seed, temperature, top_k, max_tokens;
``n`` choices per request where it honours them), N times per prompt with distinct seeds; the reference law comes
from :mod:`verispec.audit.reference`; the test is :mod:`verispec.audit.stats` (chi-square under the tolerance
null TV <= tau, its p-value, worst-case power and the smallest detectable TV). Verdict: ``fail`` when the null is
rejected at ``alpha``, else ``pass`` when the run could detect an average TV of ``target_tv`` with power >=
``power``, else ``underpowered``. Any error of the endpoints or the settings raises
:class:`~verispec.audit.client.AuditInputError` before a verdict (never one on partial data).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from verispec.audit import stats
from verispec.audit.client import AuditInputError, EngineClient
from verispec.audit.reference import ModelReference, Outcome, UrlReference
from verispec.audit.report import write_report
from verispec.core import rules as _rules
from verispec.core.sampling import SamplingConfig

__all__ = ["AUTO_PROMPTS", "AuditReport", "audit", "choose_design"]

#: candidate prompts of the automatic design (completions of code and prose the coder pair continues diversely)
AUTO_PROMPTS = (
    "# Python 3\nprint(",
    "import os\nimport",
    "while True:\n    ",
    "for i in range(",
    "import numpy as np\nimport",
    "x = [1, 2, 3]\nprint(",
)
#: tolerance: tau = max(TAU_FLOOR, TAU_SAFETY x the measured float noise of the reference)
TAU_FLOOR = 1e-3
TAU_SAFETY = 10.0
#: the automatic design skips a prompt whose reference law moves by more than this TV between two batch shapes
#: (quantized llama.cpp kernels moved some prompts' 2-token laws by TV 0.007-0.035, others by 1e-16)
NOISE_MAX = 1e-4
#: the automatic design's sampling settings, tried in order (length, top_k, temperature)
AUTO_SETTINGS = ((3, 2, 1.0), (2, 3, 1.0), (3, 3, 1.0))


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[audit] {msg}", file=sys.stderr, flush=True)


@dataclass
class AuditReport:
    """Everything an audit found; :meth:`as_dict` is the JSON report, ``verdict`` is pass / fail / underpowered."""

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

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "underpowered": 2}.get(self.verdict, 3)


def _cfg(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None,
         penalties: dict | None, logit_bias: dict | None) -> SamplingConfig:
    pen = dict(penalties or {})
    bias = {int(k): float(v) for k, v in (logit_bias or {}).items()} or None
    return SamplingConfig(temperature=temperature, top_k=top_k or None, top_p=top_p, min_p=min_p,
                          logit_bias=bias, **pen)


def _spread(law: dict[Outcome, float]) -> float:
    return 1.0 / sum(v * v for v in law.values())


def choose_design(ref: Any, prompts: Sequence[str], settings: Sequence[tuple[int, int, float]], make_cfg: Callable,
                  rule: _rules.Rule | None, gamma: int, verifier: str, target_tv: float, alpha: float,
                  power: float, max_prompts: int = 2, quiet: bool = True) -> dict:
    """Pick (length, top_k, temperature) and up to ``max_prompts`` prompts whose reference laws are spread over
    several continuations (largest outcome <= 0.6, effective number of outcomes 1 / sum p^2 >= 3), clear of
    top-k near-ties and numerically stable (:data:`NOISE_MAX`): of every setting, the design that needs the
    fewest samples (:func:`stats.plan`) for ``target_tv``. Returns the chosen laws and the plan."""
    best: dict | None = None
    for length, top_k, temperature in settings:
        cfg = make_cfg(temperature, top_k)
        good = []
        for prompt in prompts:
            ties_before = len(ref.ties)
            law, paths = ref.law(prompt, cfg, length, rule, gamma, verifier)
            if len(ref.ties) > ties_before:
                _say(f"skipping {prompt!r}: a near-tie at the top-k boundary", quiet)
                continue
            if max(law.values()) <= 0.6 and _spread(law) >= 3:
                noise = ref.noise_tv(prompt, cfg, paths)
                if noise > NOISE_MAX:
                    _say(f"skipping {prompt!r}: the reference's law moves by TV {noise:.2g} with the batch shape",
                         quiet)
                    continue
                good.append((prompt, law, paths))
        if not good:
            continue
        good.sort(key=lambda g: -_spread(g[1]))
        for j in range(1, min(max_prompts, len(good)) + 1):
            chosen = good[:j]
            n, _ = stats.plan([g[1] for g in chosen], target_tv, TAU_FLOOR, alpha, power)
            cand = {"length": length, "top_k": top_k, "temperature": temperature, "chosen": chosen,
                    "n_per_prompt": n, "n_total": n * j}
            # one more prompt is worth up to 20% more samples (a defect may show in one context only)
            if best is None or cand["n_total"] < best["n_total"] * (1.2 if j > len(best["chosen"]) else 1.0):
                best = cand
    if best is None:
        raise AuditInputError("no candidate prompt has a reference law spread over several continuations at the "
                              "automatic settings: give --prompts, --temperature and --top-k")
    return best


def _sample(client: EngineClient, prompts: list[str], n_per_prompt: int, fields: dict, per_request: int,
            seed: int, concurrency: int, deadline: float, quiet: bool, want_logprobs: bool
            ) -> tuple[list[Counter], list[list[dict]], list[dict], bool]:
    """Counts of outcomes per prompt (requests interleaved over prompts, seeds distinct), the choices' logprobs,
    the ``verispec`` blocks, and whether the deadline cut the sampling short."""
    jobs = []
    per = max(1, per_request)
    for i in range(0, n_per_prompt, per):
        for j in range(len(prompts)):
            jobs.append((j, min(per, n_per_prompt - i)))
    counts = [Counter() for _ in prompts]
    lps: list[list[dict]] = [[] for _ in prompts]
    extras: list[dict] = []
    lock, stop = threading.Lock(), threading.Event()
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
            for ch in choices:
                ended = ch.get("finish_reason") == "stop"
                counts[j][(ch["text"], ended)] += 1
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

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        futures = [pool.submit(run, i) for i in range(len(jobs))]
        try:
            for f in futures:
                f.result()
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            raise
    # a cut run keeps only whole rounds over the prompts (the same N for every prompt)
    n_each = min(sum(c.values()) for c in counts)
    cut = stop.is_set()
    if cut and any(sum(c.values()) != n_each for c in counts):
        counts = [_trim(c, n_each) for c in counts]
    return counts, lps, extras, cut


def _trim(c: Counter, n: int) -> Counter:
    """Keep ``n`` of the samples in ``c`` (the last requests of a prompt whose round over prompts did not finish;
    which samples go is fixed by their order of arrival, not by their value)."""
    out: Counter = Counter()
    left = n
    for k, v in c.items():
        take = min(v, left)
        if take:
            out[k] = take
        left -= take
    return out


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


def _acceptance(extras: list[dict]) -> dict | None:
    drafted = sum(int((e.get("metrics") or {}).get("drafted") or 0) for e in extras)
    accepted = sum(int((e.get("metrics") or {}).get("accepted") or 0) for e in extras)
    per_pos: list[list[float]] = []
    for e in extras:
        a = (e.get("metrics") or {}).get("acceptance_per_position")
        if isinstance(a, list):
            per_pos.append([float(x) for x in a if x is not None])
    if not extras:
        return None
    width = max((len(a) for a in per_pos), default=0)
    profile = [float(np.mean([a[i] for a in per_pos if len(a) > i])) for i in range(width)]
    rules = sorted({str(e.get("rule")) for e in extras})
    return {"drafted": drafted, "accepted": accepted, "per_position": profile, "rules_reported": rules,
            "responses": len(extras)}


def audit(base_url: str, model: str, *, reference_model: str | None = None, reference_url: str | None = None,
          reference: Any = None, reference_model_name: str | None = None, reference_draft: str | None = None,
          reference_logprobs: str = "auto", api_key: str | None = None, prompts: Sequence[str] | None = None,
          alpha: float = 1e-4, target_tv: float = 0.05, power: float = 0.9, time_limit: float = 600.0,
          temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
          min_p: float | None = None, length: int | None = None, penalties: dict | None = None,
          logit_bias: dict | None = None, verification: dict | None = None, gamma: int | None = None,
          extra_body: dict | None = None, n: int | None = None, per_request: int = 8, concurrency: int = 8,
          seed: int = 0, tau: float | None = None, tie_gap: float | None = None, check_logprobs: bool = False,
          out_dir: str | None = None, threads: int | None = None, quiet: bool = False) -> AuditReport:
    """Audit the engine at ``base_url`` serving ``model``; see the module docstring. The reference is
    ``reference_model`` (a GGUF or registered name, llama.cpp; or an HF directory, transformers; with
    ``reference_draft`` for a declared lossy rule's law), ``reference_url`` (an endpoint of the same model without
    speculation, read through its top logprobs: ``reference_logprobs`` "auto", "processed" or "raw"), or a ready
    ``reference`` object (:class:`~verispec.audit.reference.ModelReference`). Unset sampling settings and prompts
    are chosen automatically (:func:`choose_design`); ``n`` fixes the samples per prompt (default: planned for
    ``target_tv`` at ``power``). ``verification`` is sent in each request body and declares the rule whose law is
    audited (its exact induced law for a lossy rule, with ``gamma`` drafts per round); ``gamma`` is sent as
    verispec's ``speculative: {"gamma": gamma}``; ``extra_body`` adds any other fields. ``tie_gap``: the logit
    gap at the top-k boundary below which a prefix counts as a near-tie (default
    :data:`~verispec.audit.reference.TIE_GAP`): the automatic design skips such prompts, given prompts with one
    are refused. With ``out_dir`` the report (markdown, JSON, figure) is written there."""
    t_start = time.monotonic()
    if sum(x is not None for x in (reference_model, reference_url, reference)) != 1:
        raise AuditInputError("give exactly one reference: --reference-model (a GGUF or HF directory of the same "
                              "weights) or --reference-url (an endpoint of the same model without speculation)")
    if not 0 < alpha < 1 or not 0 < target_tv < 1 or not 0 < power < 1:
        raise AuditInputError("alpha, the target TV and the power must lie in (0, 1)")
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
    # a request that takes longer than the whole audit may is a hang, not a slow answer
    engine = EngineClient(base_url, model, api_key, timeout=max(60.0, min(600.0, time_limit)), extra_body=body_extra)

    t_ref = time.monotonic()
    if reference is not None:
        ref = reference
    elif reference_model is not None:
        _say(f"loading the reference model {reference_model}", quiet)
        ref = ModelReference.load(reference_model, threads, draft=reference_draft)
    else:
        ref = UrlReference(EngineClient(reference_url, reference_model_name or model, api_key,  # type: ignore[arg-type]
                                        role="reference"), reference_logprobs)

    if tie_gap is not None:
        ref.tie_gap = tie_gap

    def make_cfg(t: float, k: int | None) -> SamplingConfig:
        return _cfg(t, k, top_p, min_p, penalties, logit_bias)

    fixed = temperature is not None and top_k is not None and length is not None and prompts
    settings = [(length or 3, top_k if top_k is not None else 3, temperature if temperature is not None else 1.0)]
    if not fixed and (temperature is None and top_k is None and length is None):
        settings = list(AUTO_SETTINGS)
    candidates = list(prompts) if prompts else list(AUTO_PROMPTS)
    if fixed:
        cfg = make_cfg(settings[0][2], settings[0][1])
        chosen = [(p, *ref.law(p, cfg, settings[0][0], rule, gamma or 0, verifier)) for p in candidates]
        if ref.ties:
            raise AuditInputError(f"a near-tie at the top-k boundary (logit gap {min(g for _, g in ref.ties):.3f} < "
                                  f"{ref.tie_gap}): the engine's kernels may keep another token there, so a verdict "
                                  f"could be a false fail; pick another prompt or --top-k, or lower --tie-gap when "
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
    tau_used = tau if tau is not None else max(TAU_FLOOR, TAU_SAFETY * noise)
    n_needed, min_prob = stats.plan(laws, target_tv, tau_used, alpha, power)
    planned = int(n) if n is not None else n_needed
    ref_seconds = time.monotonic() - t_ref
    _say(f"design: {len(chosen_prompts)} prompt(s), {length} tokens, top_k {top_k_used}, T {temp}; "
         f"{planned} samples per prompt planned (tau {tau_used:.2g}, measured noise {noise:.2g})", quiet)

    fields: dict[str, Any] = {"max_tokens": length, "temperature": temp}
    if top_k_used:
        fields["top_k"] = top_k_used
    for name, value in (("top_p", top_p), ("min_p", min_p)):
        if value is not None:
            fields[name] = value
    for name, value in (penalties or {}).items():
        fields[name] = value
    if logit_bias:
        fields["logit_bias"] = {str(k): v for k, v in logit_bias.items()}

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
    counts, lps, extras, cut = _sample(engine, chosen_prompts, planned, fields, per_request, seed, concurrency,
                                       deadline, quiet, check_logprobs)
    sample_seconds = time.monotonic() - t_sample
    n_each = min(sum(c.values()) for c in counts)
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
    if cut:
        notes.append(f"--time-limit {time_limit:.0f} s reached after {n_each} of {planned} samples per prompt")
    if ref.ties:
        notes.append(f"{len(ref.ties)} near-tie(s) at the top-k boundary in the reference (logit gap < 0.02): "
                     f"float noise there can move mass between continuations")
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
                  "law": (f"{rule.name} induced law (gamma {gamma}, verifier {verifier})"
                          if rule is not None and not rule.lossless else "target law (lossless)")},
        prompts=chosen_prompts,
        test={"name": "chi-square goodness of fit under the tolerance null TV <= tau (noncentral), Bonferroni with "
                      "a binomial test of zero-probability continuations",
              "alpha": alpha, "tau": tau_used, "tau_measured_noise": noise, "lambda0": lam0, "df": df, "x2": x2,
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
        acceptance=_acceptance(extras),
        notes=notes,
    )
    _say(f"verdict {verdict}: p = {pvalue:.3g} (alpha {alpha:g}), TV {tv_hat:.3f} [{tv_lo:.3f}, {tv_hi:.3f}], "
         f"N {n_total}, smallest TV detectable with power {power}: {mdt:.3f}", quiet)
    if out_dir is not None:
        write_report(report, out_dir)
    return report
