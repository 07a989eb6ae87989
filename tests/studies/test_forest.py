"""`verispec bench forest`: every Table 1 / Table 6 gap of a committed run, the same numbers `bench compare` gives,
beside the paper's values quoted from its tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from verispec.cli.main import main
from verispec.eval.report import compare_runs
from verispec.studies.forest import PAPER_GAPS, forest_table, write_forest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "table1_power"


def test_paper_gaps_quote_the_tables():
    by = {g.setting: g for g in PAPER_GAPS}
    # Table 1 against Table 2's standard SD on MBPP+ (5.47, 75.84)
    assert by["adaptive-interpolation(lam=0.2)"].paper_d_acc == pytest.approx(50.26 - 75.84)
    assert by["adaptive-interpolation(lam=0.8, realization=residual)"].paper_d_be == pytest.approx(5.95 - 5.47)
    assert by["overshoot-ceiling(lam=0.6)"].paper_d_acc == pytest.approx(75.66 - 75.84)
    # Table 6 against its own lossless row (5.42, 75.66); the min-p cap matches it exactly
    assert by["minp-cap(p_base=0.5, l=0.4)"].paper_d_acc == 0.0
    assert by["spec-cascade(p_base=0.5)"].paper_d_be == pytest.approx(0.09)
    assert len(by) == len(PAPER_GAPS) == 16


@pytest.fixture(scope="module")
def table():
    return forest_table(RUN, n_boot=200)


def test_every_gap_of_the_complete_grid_with_compare_numbers(table):
    assert len(table) == 16 and set(table["pairs"]) == {492}
    for row in table.head(3).itertuples():
        ref, _ = compare_runs(RUN, None, [(row.setting, row.baseline)], n_boot=200)
        r = ref.iloc[0]
        assert (row.d_acc, row.d_acc_lo, row.d_acc_hi) == (r.a_d_acc, r.a_d_acc_lo, r.a_d_acc_hi)
        assert (row.d_be, row.d_be_lo, row.d_be_hi) == (r.a_d_be, r.a_d_be_lo, r.a_d_be_hi)
    for row in table.itertuples():
        assert row.d_acc_lo <= row.d_acc <= row.d_acc_hi
        assert row.excludes_paper_acc == (not row.d_acc_lo <= row.paper_d_acc <= row.d_acc_hi)


def test_write_forest_files(table, tmp_path):
    paths = write_forest(table, tmp_path, "table1_power")
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    md = paths["md"].read_text()
    assert md.count("| Table 1 |") == 12 and md.count("| Table 6 |") == 4
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_the_settings_is_refused_by_name():
    result = CliRunner().invoke(main, ["bench", "forest", str(ROOT / "docs" / "results" / "smoke")])
    assert result.exit_code != 0
    assert "none of the paper's Table 1 / Table 6 settings" in result.output
