"""Sampling processors against hand-computed small examples (exact where the arithmetic allows, else 1e-12)."""

from __future__ import annotations

import math

import pytest
import torch

from verispec.core.sampling import (
    SamplingConfig,
    apply_penalties,
    entropy,
    eta_mask,
    eta_threshold,
    history_counts,
    minp_mask,
    probs_from_logits,
    process,
    renormalize_on,
    top_k_mask,
    top_p_mask,
)

T1 = {"temperature": 1.0}  # the processors' algebra at temperature 1

TOL = 1e-12
P4 = [0.5, 0.3, 0.15, 0.05]


def t(x: list[float]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def logits_of(probs: list[float]) -> torch.Tensor:
    return t(probs).log()


def close(a: torch.Tensor, b: list[float] | torch.Tensor, tol: float = TOL) -> bool:
    return torch.allclose(a, torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0)


# ----------------------------------------------------------------------------------------------- temperature


def test_temperature_one_is_softmax():
    out = probs_from_logits(logits_of([1 / 7, 2 / 7, 4 / 7]), SamplingConfig(temperature=1.0))
    assert close(out, [1 / 7, 2 / 7, 4 / 7])


def test_temperature_two_takes_square_roots():
    # logits = [0, ln 2, ln 4], T = 2 -> weights [1, sqrt 2, 2] / (3 + sqrt 2)
    out = probs_from_logits(t([0.0, math.log(2), math.log(4)]), SamplingConfig(temperature=2.0))
    z = 3 + math.sqrt(2)
    assert close(out, [1 / z, math.sqrt(2) / z, 2 / z])


def test_temperature_half_squares():
    out = probs_from_logits(t([0.0, math.log(2), math.log(3)]), SamplingConfig(temperature=0.5))
    assert close(out, [1 / 14, 4 / 14, 9 / 14])


def test_a_vanishing_temperature_is_its_limit_not_nan():
    """T = 1e-310 (logits / T overflow float64): the limit law, uniform over the argmax ties, never NaN; for target
    (float32 logits) and a masked token alike."""
    for dtype in (torch.float64, torch.float32):
        logits = torch.tensor([1.0, 3.0, 3.0, float("-inf"), -2.0], dtype=dtype)
        out = probs_from_logits(logits, SamplingConfig(temperature=1e-310))
        assert close(out, [0.0, 0.5, 0.5, 0.0, 0.0])


def test_output_dtype_and_normalized():
    out = probs_from_logits(torch.randn(4, 11, dtype=torch.float32), SamplingConfig(temperature=0.7))
    assert out.dtype == torch.float64
    assert close(out.sum(-1), [1.0] * 4)


# ----------------------------------------------------------------------------------------------- greedy


def test_greedy_is_one_hot_argmax():
    out = probs_from_logits(t([0.1, 3.0, -2.0, 2.9]), SamplingConfig(temperature=0))
    assert out.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_tie_takes_first_index():
    out = probs_from_logits(t([1.0, 5.0, 5.0, 0.0]), SamplingConfig(temperature=0))
    assert out.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_ignores_truncation_and_is_batched():
    cfg = SamplingConfig(temperature=0, top_k=1, top_p=0.5, min_p=0.9, eta=0.3)
    logits = t([[0.0, 1.0, 2.0], [9.0, 1.0, 2.0]])
    assert probs_from_logits(logits, cfg).tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


# ----------------------------------------------------------------------------------------------- top-k


def test_top_k():
    out = probs_from_logits(logits_of([0.1, 0.2, 0.3, 0.4]), SamplingConfig(temperature=1.0, top_k=2))
    assert close(out, [0.0, 0.0, 3 / 7, 4 / 7])
    assert top_k_mask(t([0.1, 0.2, 0.3, 0.4]), 2).tolist() == [False, False, True, True]


def test_top_k_keeps_ties_and_caps_at_vocab():
    assert top_k_mask(t([0.4, 0.3, 0.3]), 2).tolist() == [True, True, True]
    assert top_k_mask(t([0.4, 0.3, 0.3]), 10).tolist() == [True, True, True]
    out = probs_from_logits(logits_of([0.1, 0.2, 0.3, 0.4]), SamplingConfig(temperature=1.0, top_k=1))
    assert out.tolist() == [0.0, 0.0, 0.0, 1.0]


# ----------------------------------------------------------------------------------------------- top-p


def test_top_p_smallest_prefix():
    # descending masses before each token: [0, 0.5, 0.8, 0.95]
    assert top_p_mask(t(P4), 0.75).tolist() == [True, True, False, False]
    assert top_p_mask(t(P4), 0.85).tolist() == [True, True, True, False]
    assert top_p_mask(t(P4), 0.3).tolist() == [True, False, False, False]
    assert top_p_mask(t(P4), 1.0).all()
    out = probs_from_logits(logits_of(P4), SamplingConfig(temperature=1.0, top_p=0.75))
    assert close(out, [5 / 8, 3 / 8, 0.0, 0.0])


def test_top_p_unsorted_input():
    probs = [0.15, 0.05, 0.5, 0.3]
    out = probs_from_logits(logits_of(probs), SamplingConfig(temperature=1.0, top_p=0.85))
    assert close(out, [0.15 / 0.95, 0.0, 0.5 / 0.95, 0.3 / 0.95])


# ----------------------------------------------------------------------------------------------- min-p (Eq. 5)


def test_min_p_eq5():
    # threshold p_base * max p: 0.3 * 0.5 = 0.15 keeps 0.15 (>=); 0.31 * 0.5 = 0.155 drops it
    assert minp_mask(t(P4), 0.3).tolist() == [True, True, True, False]
    assert minp_mask(t(P4), 0.31).tolist() == [True, True, False, False]
    assert minp_mask(t(P4), 1.0).tolist() == [True, False, False, False]
    assert close(probs_from_logits(logits_of(P4), SamplingConfig(**T1, min_p=0.3)),
                 [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert close(probs_from_logits(logits_of(P4), SamplingConfig(temperature=1.0, min_p=0.31)), [5 / 8, 3 / 8, 0, 0])


def test_min_p_zero_is_identity():
    assert close(probs_from_logits(logits_of(P4), SamplingConfig(temperature=1.0, min_p=0.0)), P4)


# ----------------------------------------------------------------------------------------------- eta (Eq. 6)


H4 = -sum(x * math.log(x) for x in P4)  # entropy of P4 in nats, about 1.1421


def test_entropy():
    assert abs(float(entropy(t(P4))) - H4) < TOL
    assert abs(float(entropy(t([1.0, 0.0, 0.0])))) < TOL  # 0 log 0 = 0
    assert abs(float(entropy(t([0.25] * 4))) - math.log(4)) < TOL


def test_eta_threshold_eq6():
    # min(eps, delta e^-H): e^-H4 ~ 0.319
    assert abs(float(eta_threshold(t(P4), 0.1)) - 0.1 * math.exp(-H4)) < TOL  # delta defaults to epsilon
    assert abs(float(eta_threshold(t(P4), 0.1, 0.5)) - 0.1) < TOL  # 0.5 e^-H ~ 0.16 > eps
    assert abs(float(eta_threshold(t(P4), 0.2, 0.5)) - 0.5 * math.exp(-H4)) < TOL


def test_eta_mask_and_probs():
    assert eta_mask(t(P4), 0.1).tolist() == [True, True, True, True]  # thr ~ 0.032
    assert eta_mask(t(P4), 0.1, 0.5).tolist() == [True, True, True, False]  # thr = 0.1
    assert eta_mask(t(P4), 0.2, 1.0).tolist() == [True, True, False, False]  # thr = 0.2
    cfg = SamplingConfig(temperature=1.0, eta=0.2, eta_delta=1.0)
    assert close(probs_from_logits(logits_of(P4), cfg), [5 / 8, 3 / 8, 0, 0])
    cfg = SamplingConfig(temperature=1.0, eta=0.1, eta_delta=0.5)
    assert close(probs_from_logits(logits_of(P4), cfg), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])


def test_eta_keeps_argmax():
    # eps = 1, delta = 2: threshold min(1, 2 e^-H) ~ 1.35 exceeds every probability; the argmax is kept
    probs = t([0.05, 0.9, 0.05])
    assert float(eta_threshold(probs, 1.0, 2.0)) > 0.9
    assert eta_mask(probs, 1.0, 2.0).tolist() == [False, True, False]
    assert probs_from_logits(probs.log(), SamplingConfig(**T1, eta=1.0, eta_delta=2.0)).tolist() == [0.0, 1.0, 0.0]


# ----------------------------------------------------------------------------------------------- composition


def test_order_top_k_before_top_p():
    # top-k=3 renormalizes [0.4, 0.3, 0.2] -> [4/9, 3/9, 2/9]; top-p 0.75 then keeps two (mass before the third
    # is 7/9 >= 0.75). Top-p first on the raw distribution would keep three (mass before the third is 0.7).
    out = probs_from_logits(logits_of([0.4, 0.3, 0.2, 0.1]), SamplingConfig(temperature=1.0, top_k=3, top_p=0.75))
    assert close(out, [4 / 7, 3 / 7, 0, 0])


def test_order_top_p_before_min_p():
    # top-p 0.85 -> [0.5, 0.3, 0.15] / 0.95; then min-p 0.5 (threshold 0.25 of the max) keeps two
    out = probs_from_logits(logits_of(P4), SamplingConfig(temperature=1.0, top_p=0.85, min_p=0.5))
    assert close(out, [5 / 8, 3 / 8, 0, 0])


def test_order_temperature_before_min_p():
    # T = 0.5 squares: [0.25, 0.09, 0.0225, 0.0025] / 0.365; min-p 0.3 (threshold 0.075 of 0.25 unnormalized)
    # keeps two; at T = 1 it keeps three (see test_min_p_eq5)
    out = probs_from_logits(logits_of(P4), SamplingConfig(temperature=0.5, min_p=0.3))
    assert close(out, [0.25 / 0.34, 0.09 / 0.34, 0, 0])


def test_order_min_p_before_eta():
    # min-p 0.3 -> r = [0.5, 0.3, 0.15] / 0.95; eta (eps 0.2, delta 1) uses H(r): thr = min(0.2, e^-H(r)) = 0.2
    # keeps r >= 0.2, i.e. two tokens (0.15/0.95 ~ 0.158 dropped)
    r = [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95]
    assert math.exp(sum(x * math.log(x) for x in r)) > 0.2
    out = probs_from_logits(logits_of(P4), SamplingConfig(temperature=1.0, min_p=0.3, eta=0.2, eta_delta=1.0))
    assert close(out, [5 / 8, 3 / 8, 0, 0])


def test_full_pipeline_equals_manual_composition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g, dtype=torch.float64) * 2
    counts = torch.randint(0, 3, (3, 40), generator=g)
    cfg = SamplingConfig(
        temperature=0.8, top_k=30, top_p=0.95, min_p=0.05, eta=0.05, repetition_penalty=1.3,
        frequency_penalty=0.2, presence_penalty=0.1,
    )
    x = apply_penalties(logits, counts, cfg)
    probs = torch.softmax(x / 0.8, -1)
    probs = renormalize_on(probs, top_k_mask(probs, 30))
    probs = renormalize_on(probs, top_p_mask(probs, 0.95))
    probs = renormalize_on(probs, minp_mask(probs, 0.05))
    probs = renormalize_on(probs, eta_mask(probs, 0.05))
    assert torch.equal(process(logits, cfg, counts), probs)


# ----------------------------------------------------------------------------------------------- penalties


def test_repetition_penalty_both_signs():
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=2.0)
    logits = t([2.0, -1.0, 0.5, -3.0])
    counts = torch.tensor([1, 1, 0, 0])
    # seen positive logit divided, seen negative multiplied, unseen untouched
    assert apply_penalties(logits, counts, cfg).tolist() == [1.0, -2.0, 0.5, -3.0]


def test_repetition_penalty_below_one_boosts():
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=0.5)
    assert apply_penalties(t([2.0, -1.0]), torch.tensor([3, 1]), cfg).tolist() == [4.0, -0.5]


def test_frequency_and_presence_penalties():
    cfg = SamplingConfig(temperature=1.0, frequency_penalty=0.5, presence_penalty=1.0)
    logits = t([2.0, -1.0, 0.5])
    counts = torch.tensor([2, 0, 1])
    # logit - 0.5 * count - 1.0 * [count > 0]
    assert apply_penalties(logits, counts, cfg).tolist() == [0.0, -1.0, -1.0]


def test_all_penalties_compose_repetition_first():
    cfg = SamplingConfig(temperature=1.0, repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    # token 0: 3 / 2 - 0.25 * 2 - 0.5 = 0.5; token 1: -1 * 2 - 0.25 - 0.5 = -2.75; token 2 unseen
    out = apply_penalties(t([3.0, -1.0, 1.0]), torch.tensor([2, 1, 0]), cfg)
    assert out.tolist() == [0.5, -2.75, 1.0]


def test_no_penalty_is_identity_and_uses_history():
    cfg = SamplingConfig(temperature=1.0)
    logits = t([1.0, 2.0])
    assert apply_penalties(logits, torch.tensor([5, 5]), cfg) is logits
    assert not cfg.uses_history
    assert SamplingConfig(temperature=1.0, repetition_penalty=1.1).uses_history
    assert SamplingConfig(temperature=1.0, frequency_penalty=0.1).uses_history
    assert SamplingConfig(temperature=1.0, presence_penalty=-0.1).uses_history


def test_process_applies_penalties_before_temperature():
    cfg = SamplingConfig(temperature=2.0, presence_penalty=math.log(4))
    # logits [0, 0] with token 0 seen: [-ln 4, 0] / 2 = [-ln 2, 0] -> [1/3, 2/3]
    out = process(t([0.0, 0.0]), cfg, torch.tensor([1, 0]))
    assert close(out, [1 / 3, 2 / 3])
    assert close(process(t([0.0, 0.0]), cfg), [0.5, 0.5])  # no counts -> no penalties


def test_history_counts():
    base = torch.tensor([0, 1, 0, 0])
    out = history_counts(base, torch.tensor([2, 2, 1]))
    assert out.tolist() == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 2, 0], [0, 2, 2, 0]]
    assert history_counts(base, torch.tensor([], dtype=torch.long)).tolist() == [[0, 1, 0, 0]]
    assert base.tolist() == [0, 1, 0, 0]  # input not modified


def test_history_counts_feed_penalties_per_prefix():
    cfg = SamplingConfig(temperature=1.0, frequency_penalty=1.0)
    counts = history_counts(torch.zeros(3, dtype=torch.long), torch.tensor([1, 1]))
    out = apply_penalties(torch.zeros(3, 3, dtype=torch.float64), counts, cfg)
    assert out.tolist() == [[0.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, -2.0, 0.0]]


# ----------------------------------------------------------------------------------------------- batching


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0.7, top_k=5),
        SamplingConfig(temperature=1.0, top_p=0.6),
        SamplingConfig(temperature=1.0, min_p=0.2),
        SamplingConfig(temperature=1.0, eta=0.08),
        SamplingConfig(temperature=0),
        SamplingConfig(temperature=1.3, top_k=9, top_p=0.9, min_p=0.05, eta=0.02, repetition_penalty=1.5,
                       frequency_penalty=0.3, presence_penalty=0.2),
    ],
)
def test_batched_leading_dims_match_rows(cfg):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 17, generator=g, dtype=torch.float64) * 3
    counts = torch.randint(0, 3, (2, 3, 17), generator=g)
    out = process(logits, cfg, counts)
    assert out.shape == (2, 3, 17)
    for i in range(2):
        for j in range(3):
            assert torch.equal(out[i, j], process(logits[i, j], cfg, counts[i, j]))
    assert close(out.sum(-1), torch.ones(2, 3))
    assert (out >= 0).all()


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cfg", [SamplingConfig(**T1), SamplingConfig(temperature=0), SamplingConfig(**T1, top_k=2)])
def test_nan_logits_raise(cfg):
    logits = t([[0.0, 1.0, 2.0], [0.0, float("nan"), 1.0]])
    with pytest.raises(ValueError, match="NaN"):
        probs_from_logits(logits, cfg)
    with pytest.raises(ValueError, match="NaN"):
        process(logits, cfg, torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"eta": 0.0}, "eta"),
        ({"eta": float("nan")}, "eta"),
        ({"eta_delta": 0.0}, "eta_delta"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"presence_penalty": float("inf")}, "presence_penalty"),
    ],
)
def test_invalid_config_raises_naming_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_with_revalidates():
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    assert cfg.with_(top_k=5).top_k == 5
    with pytest.raises(ValueError, match="top_k"):
        cfg.with_(top_k=0)


def test_history_penalties_follow_openai_and_hf():
    """Frequency / presence penalties count generated tokens only (OpenAI, vLLM); the repetition penalty counts
    prompt and generated tokens (Hugging Face). A prompt-only token is hit by repetition, not by frequency."""
    from verispec.core.sampling import History

    h = History.of([0, 0, 1], [2, 2], 4)
    assert h.all.tolist() == [2, 1, 2, 0] and h.generated.tolist() == [0, 0, 2, 0]
    logits = torch.tensor([1.0, 1.0, 1.0, 1.0])
    freq = apply_penalties(logits, h, SamplingConfig(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.25))
    assert freq.tolist() == [1.0, 1.0, 1.0 - 1.0 - 0.25, 1.0]
    rep = apply_penalties(logits, h, SamplingConfig(temperature=1.0, repetition_penalty=2.0))
    assert rep.tolist() == [0.5, 0.5, 0.5, 1.0]
    rows = h.prefixes([3, 2])
    assert rows.generated.tolist() == [[0, 0, 2, 0], [0, 0, 2, 1], [0, 0, 3, 1]]
    assert rows.all[:, 0].tolist() == [2, 2, 2]
    ext = h.extended([3])
    assert ext.generated[3] == 1 and h.generated[3] == 0  # a copy


# -- logit_bias: added first, identical for target and draft ---------------------------------------------------
def test_logit_bias_is_added_before_penalties_and_temperature():
    logits = torch.tensor([1.0, 2.0, -1.0, 0.5])
    cfg = SamplingConfig(temperature=2.0, logit_bias={2: 3.0, 0: -1.0}, repetition_penalty=2.0)
    counts = torch.tensor([0, 0, 1, 0])
    biased = torch.tensor([0.0, 2.0, 2.0, 0.5])  # bias first: token 2 goes from -1 to 2 ...
    biased[2] = 2.0 / 2.0  # ... then the repetition penalty divides its (now positive) logit
    want = torch.softmax(biased.double() / 2.0, -1)
    assert torch.allclose(process(logits, cfg, counts), want)
    assert cfg.logit_bias == ((0, -1.0), (2, 3.0)) and cfg.adjusts_logits  # a dict is stored sorted
    # greedy follows the biased argmax
    assert int(process(logits, SamplingConfig(temperature=0, logit_bias={3: 5.0})).argmax()) == 3
    assert not SamplingConfig(temperature=0).adjusts_logits


@pytest.mark.parametrize("bias, message", [
    ({1: 101.0}, "must be a number in"),
    ({1: float("nan")}, "must be a number in"),
    ({-1: 1.0}, "integers >= 0"),
    ({"3": 1.0}, "integers >= 0"),
    (((1, 1.0), (1, 2.0)), "given twice"),
])
def test_logit_bias_bad_values_are_named(bias, message):
    with pytest.raises(ValueError, match=f"logit_bias.*{message}"):
        SamplingConfig(logit_bias=bias)


def test_logit_bias_outside_the_vocabulary_is_named():
    cfg = SamplingConfig(logit_bias={70: 1.0})
    with pytest.raises(ValueError, match=r"logit_bias: token 70 is outside the vocabulary \[0, 64\)"):
        cfg.check_vocab(64)
    with pytest.raises(ValueError, match="token 70 is outside"):
        process(torch.zeros(64), cfg)
    SamplingConfig(logit_bias={}).check_vocab(1)  # empty: no bias
    assert SamplingConfig(logit_bias={}).logit_bias is None
