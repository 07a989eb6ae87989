"""Every committed run report regenerates byte for byte from its run's result lines: for each directory of
docs/results holding a run (config.json) and its report/, ``write_report`` (what ``verispec bench report`` runs,
from the checkout's root) into a scratch directory gives the same files (Markdown, CSV, PNG) with the same bytes,
and no file of the committed report is missing from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from verispec.eval.report import write_report

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted(d.relative_to(ROOT) for d in (ROOT / "docs" / "results").iterdir()
              if (d / "config.json").exists() and (d / "report").is_dir())


def test_there_are_reports_to_check():
    assert len(RUNS) >= 5


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_report_regenerates_byte_for_byte(run, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the report names its run directory as given: relative to the checkout, as committed
    write_report(run, tmp_path)
    committed = sorted(p.relative_to(run / "report") for p in (run / "report").rglob("*") if p.is_file())
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert committed == fresh, f"{run.name}: the report's files differ from what its results make"
    for rel in committed:
        assert (run / "report" / rel).read_bytes() == (tmp_path / rel).read_bytes(), f"{run.name}/report/{rel}"
