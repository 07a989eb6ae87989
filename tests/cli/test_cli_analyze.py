"""``verispec analyze`` / ``rules`` / ``simulate`` through click's CliRunner (exact values, one-line errors)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from verispec.cli.main import main

P = "0.6,0.3,0.1"
Q = "0.2,0.5,0.3"
TOL = 1e-12


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def analyze_json(*args: str) -> dict:
    res = run("analyze", *args, "--json")
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    assert len(lines) == 1  # exactly one JSON object
    return json.loads(lines[0])


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < TOL for x, y in zip(a, b, strict=True))


def test_lossless_worked_example():
    out = analyze_json("--rule", "lossless", "--p", P, "--q", Q)
    assert {"induced", "acceptance", "tv_to_p", "kl_to_p"} <= set(out)
    assert "tv_to_matched" not in out and "kl_to_matched" not in out
    assert close(out["induced"], [0.6, 0.3, 0.1])
    assert abs(out["acceptance"] - 0.6) < TOL  # 1 - TV(p, q)
    assert abs(out["tv_to_p"]) < TOL and abs(out["kl_to_p"]) < TOL


def test_naive_resample_worked_example():
    out = analyze_json("--rule", "naive-resample", "--p", P, "--q", Q)
    assert close(out["induced"], [0.44, 0.42, 0.14])
    assert abs(out["acceptance"] - 0.6) < TOL
    assert abs(out["tv_to_p"] - 0.16) < TOL
    kl = 0.44 * math.log(0.44 / 0.6) + 0.42 * math.log(0.42 / 0.3) + 0.14 * math.log(0.14 / 0.1)
    assert abs(out["kl_to_p"] - kl) < TOL


def test_one_hot_draft_acceptance():
    out = analyze_json("--rule", "lossless", "--p", P, "--q", "0,1,0")
    assert close(out["induced"], [0.6, 0.3, 0.1])
    assert abs(out["acceptance"] - 0.3) < TOL


def test_params_and_alias():
    out = analyze_json("--rule", "cos-we", "--param", "lambda=0.25", "--p", P, "--q", Q)
    assert close(out["induced"], [0.25 * a + 0.75 * b for a, b in zip([0.6, 0.3, 0.1], [0.2, 0.5, 0.3], strict=True)])


def test_matched_target_for_spec_cascade():
    # p_base 0.3: A = {0, 1}; Eq. 13 gives q / Z(q) on A = [2/7, 5/7, 0]; p_Theta = [2/3, 1/3, 0]
    out = analyze_json("--rule", "spec-cascade", "--param", "p_base=0.3", "--p", P, "--q", Q)
    assert close(out["induced"], [2 / 7, 5 / 7, 0.0])
    assert abs(out["acceptance"] - 0.7) < TOL
    assert abs(out["tv_to_matched"] - (2 / 3 - 2 / 7)) < TOL
    assert out["kl_to_matched"] > 0
    assert close(out["matched_target"], [2 / 3, 1 / 3, 0.0])


def test_truncation_baseline_has_zero_distance_to_its_target():
    out = analyze_json("--rule", "minp-sampling", "--param", "p_base=0.3", "--p", P, "--q", Q)
    assert close(out["induced"], [2 / 3, 1 / 3, 0.0])
    assert abs(out["tv_to_matched"]) < TOL and abs(out["kl_to_matched"]) < TOL
    assert abs(out["tv_to_p"] - 0.1) < TOL


def test_infinite_kl_is_the_string_inf():
    out = analyze_json("--rule", "cos-we", "--p", "1,0", "--q", "0,1")
    assert close(out["induced"], [0.5, 0.5])
    assert out["kl_to_p"] == "inf"


def test_sum_within_tolerance_is_accepted():
    out = analyze_json("--rule", "lossless", "--p", "0.3333333,0.3333333,0.3333334", "--q", Q)
    assert abs(sum(out["induced"]) - 1) < TOL


def test_human_output():
    res = run("analyze", "--rule", "spec-cascade", "--p", P, "--q", Q)
    assert res.exit_code == 0, res.output
    for needle in ("induced", "acceptance probability", "TV(induced, p)", "KL(induced || p)", "p_Theta"):
        assert needle in res.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rule", "lossless", "--p", "0.6,0.4", "--q", Q], "same length"),
        (["--rule", "lossless", "--p", "0.7,0.4,-0.1", "--q", Q], "negative"),
        (["--rule", "lossless", "--p", "0.6,0.3,0.2", "--q", Q], "sums to"),
        (["--rule", "lossless", "--p", P, "--q", "0.2,0.5,0.2"], "--q sums to"),
        (["--rule", "lossless", "--p", "nan,0.5,0.5", "--q", Q], "NaN"),
        (["--rule", "lossless", "--p", "inf,0,0", "--q", Q], "not finite"),
        (["--rule", "lossless", "--p", "0.6,abc,0.1", "--q", Q], "not a number"),
        (["--rule", "lossless", "--p", "0.6,,0.4", "--q", Q], "empty"),
        (["--rule", "lenience", "--param", "l=2", "--p", P, "--q", Q], "l (lenience)"),
        (["--rule", "lenience", "--param", "l=abc", "--p", P, "--q", Q], "l must be"),
        (["--rule", "cos-we", "--param", "lambda=1.5", "--p", P, "--q", Q], "lam"),
        (["--rule", "typical", "--param", "correction=both", "--p", P, "--q", Q], "correction"),
        (["--rule", "cos-cd", "--param", "q_floor=x", "--p", P, "--q", Q], "q_floor"),
        (["--rule", "lossless", "--param", "l=0.5", "--p", P, "--q", Q], "no parameter(s) l"),
        (["--rule", "lenience", "--param", "l0.5", "--p", P, "--q", Q], "name=value"),
        (["--rule", "nope", "--p", P, "--q", Q], "unknown rule 'nope'"),
        (["--p", P, "--q", Q], "missing --rule"),
        (["--rule", "lossless", "--q", Q], "missing --p"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_invalid_input_one_line_error(args, needle, as_json):
    res = run("analyze", *args, *(["--json"] if as_json else []))
    assert res.exit_code == 1
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no traceback
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("Error: ") and needle in err, err
    assert "Traceback" not in res.output
    assert res.stdout == ""


def test_rules_command():
    res = run("rules", "--json")
    assert res.exit_code == 0
    names = [r["name"] for r in json.loads(res.stdout)]
    assert "lossless" in names and "typical" in names
    res = run("rules")
    assert res.exit_code == 0 and "spec-cascade" in res.stdout


def test_simulate_command(tmp_path):
    res = run("simulate", "--out", str(tmp_path), "--pairs", "5")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "figure4_lemma1.csv").exists() and (tmp_path / "figure4_lemma1.png").exists()


P5 = "0.5,0.25,0.15,0.07,0.03"
Q5 = "0.2,0.35,0.05,0.3,0.1"


def test_adaptive_interpolation_differs_from_cos_we_unless_residual():
    """Issue 15 'done when': the default realization shows a distribution different from CoS-WE, and
    realization=residual shows CoS-WE exactly; sum(P) is printed."""
    norm = analyze_json("--rule", "adaptive-interpolation", "--param", "lam=0.4", "--p", P5, "--q", Q5)
    res = analyze_json("--rule", "adaptive-interpolation", "--param", "lam=0.4", "--param", "realization=residual",
                       "--p", P5, "--q", Q5)
    cos = analyze_json("--rule", "cos-we", "--param", "lam=0.4", "--p", P5, "--q", Q5)
    assert norm["realization"] == "normalized" and res["realization"] == "residual"
    assert abs(norm["reference_sum"] - 0.99) < TOL and abs(res["reference_sum"] - 0.99) < TOL
    assert norm["tv_to_cos_we"] > 1e-3 and not close(norm["induced"], cos["induced"])
    assert abs(res["tv_to_cos_we"]) < TOL and close(res["induced"], cos["induced"])
    assert norm["cos_we"] == "cos-we(lam=0.4)"
    assert "reference_sum" not in cos


def test_ceiling_rule_and_human_output():
    out = analyze_json("--rule", "ceiling", "--param", "l=0.4", "--p", P5, "--q", Q5)
    ref = [min(q, p / 0.4) for p, q in zip((0.5, 0.25, 0.15, 0.07, 0.03), (0.2, 0.35, 0.05, 0.3, 0.1), strict=True)]
    assert close(out["induced"], [x / sum(ref) for x in ref])
    assert abs(out["reference_sum"] - sum(ref)) < TOL
    res = run("analyze", "--rule", "overshoot-ceiling", "--param", "lam=0.4", "--p", P5, "--q", Q5)
    assert res.exit_code == 0 and "sum(P)" in res.output and "TV(induced, cos-we(lam=0.4))" in res.output


def test_budget_chooses_the_parameter():
    """``--budget tv=EPS``: the analysed rule is the family at the chosen parameter, within EPS of p; the min-p cap
    where no l fits (its kept excess on the min-p set is 0.2 > 0.1) is analysed as the lossless rule."""
    out = analyze_json("--rule", "cos-we", "--p", P, "--q", Q, "--budget", "tv=0.1")
    assert out["budget"]["param"] == "lam" and abs(out["budget"]["value"] - 0.75) < 1e-9
    assert out["tv_to_p"] <= 0.1 + TOL
    out = analyze_json("--rule", "overshoot-ceiling", "--param", "realization=residual", "--p", P, "--q", Q,
                       "--budget", "tv=0.3")
    assert abs(out["budget"]["value"] - 0.25) < 1e-9 and abs(out["tv_to_p"] - 0.3) < 1e-9
    out = analyze_json("--rule", "minp-cap", "--param", "p_base=0.5", "--param", "realization=residual",
                       "--p", P, "--q", Q, "--budget", "tv=0.1")
    assert out["budget"]["value"] is None and close(out["induced"], [0.6, 0.3, 0.1])
    res = run("analyze", "--rule", "overshoot-ceiling", "--p", P, "--q", Q, "--budget", "tv=0.1")
    assert res.exit_code != 0 and "realization='residual'" in res.output
