"""The decision table of ``verispec.studies.verdict``: every branch of every kind, the edges (an interval end on
0, on the paper's value or on the margin counts as inside), the inputs it refuses, and the family summary."""

from __future__ import annotations

import math

import pytest

from verispec.studies.verdict import (
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    REPRODUCED_IN_DIRECTION,
    UNDECIDED,
    summarize,
    verdict,
)


@pytest.mark.parametrize(("lo", "hi", "paper", "expected"), [
    # the paper reports a loss (s < 0)
    (-30.0, -16.0, -25.6, REPRODUCED),               # excludes 0 on the paper's side, holds the paper's value
    (-12.0, -2.6, -25.6, REPRODUCED_IN_DIRECTION),   # excludes 0 on its side, not the paper's value
    (-30.0, 1.0, -25.6, UNDECIDED),                  # holds 0 and the paper's value
    (-6.3, 1.2, -25.6, NOT_REPRODUCED),              # holds 0, not the paper's value
    (3.3, 13.6, -0.8, NOT_REPRODUCED),               # excludes 0 on the other side
    (-25.6, -1.0, -25.6, REPRODUCED),                # the paper's value on an end counts as inside
    (-10.0, 0.0, -17.4, NOT_REPRODUCED),             # an end on 0 does not exclude 0
    (-20.0, 0.0, -17.4, UNDECIDED),
    # the paper reports a gain (s > 0)
    (0.02, 0.23, 0.09, REPRODUCED),
    (0.39, 0.47, 3.68, REPRODUCED_IN_DIRECTION),
    (-0.004, 0.24, 0.09, UNDECIDED),
    (-0.002, 0.025, 0.04, NOT_REPRODUCED),
    (-0.31, -0.06, 0.19, NOT_REPRODUCED),
    (0.0, 0.3, 0.1, UNDECIDED),
])
def test_effect(lo, hi, paper, expected):
    assert verdict((lo + hi) / 2, lo, hi, paper, "effect") == expected


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (-4.5, 3.9, REPRODUCED),
    (-5.0, 5.0, REPRODUCED),          # the margin itself is inside
    (-6.3, 2.0, UNDECIDED),           # crosses -m
    (-2.0, 6.0, UNDECIDED),           # crosses +m
    (-8.0, 8.0, UNDECIDED),           # wider than the margin on both sides
    (-16.0, -5.1, NOT_REPRODUCED),    # wholly below -m
    (5.1, 9.0, NOT_REPRODUCED),       # wholly above +m
])
def test_equivalence(lo, hi, expected):
    assert verdict((lo + hi) / 2, lo, hi, 0.1, "equivalence", 5.0) == expected


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (-4.9, 8.0, REPRODUCED),
    (-5.0, 1.0, REPRODUCED),
    (1.2, 7.9, REPRODUCED),
    (-6.3, 4.2, UNDECIDED),
    (-9.0, -5.0, UNDECIDED),          # hi on -m: not wholly below
    (-12.0, -5.1, NOT_REPRODUCED),
])
def test_non_inferiority(lo, hi, expected):
    assert verdict((lo + hi) / 2, lo, hi, None, "non-inferiority", 5.0) == expected


def test_not_testable():
    # by kind, whatever the interval
    assert verdict(8.3, 0.0, 25.0, -0.38, "not testable here") == NOT_TESTABLE
    assert verdict(-24.0, -30.0, -16.0, -25.6, "not testable here") == NOT_TESTABLE
    # without an estimate or an interval, whatever the kind
    for kind, paper, margin in (("effect", -9.7, None), ("equivalence", 0.1, 5.0), ("non-inferiority", None, 5.0)):
        assert verdict(None, None, None, paper, kind, margin) == NOT_TESTABLE
        assert verdict(1.0, math.nan, 2.0, paper, kind, margin) == NOT_TESTABLE
        assert verdict(math.nan, -1.0, 2.0, paper, kind, margin) == NOT_TESTABLE


def test_refused_inputs():
    with pytest.raises(ValueError, match="kind"):
        verdict(1.0, 0.5, 1.5, 1.0, "superiority")
    with pytest.raises(ValueError, match="nonzero"):
        verdict(1.0, 0.5, 1.5, None, "effect")
    with pytest.raises(ValueError, match="nonzero"):
        verdict(1.0, 0.5, 1.5, 0.0, "effect")
    with pytest.raises(ValueError, match="margin"):
        verdict(1.0, 0.5, 1.5, 0.1, "equivalence")
    with pytest.raises(ValueError, match="margin"):
        verdict(1.0, 0.5, 1.5, None, "non-inferiority", 0.0)
    with pytest.raises(ValueError, match="lo > hi"):
        verdict(1.0, 2.0, 1.0, 1.0, "effect")


def test_summarize():
    assert summarize([UNDECIDED, UNDECIDED]) == UNDECIDED
    words = [NOT_REPRODUCED, REPRODUCED_IN_DIRECTION, NOT_TESTABLE, REPRODUCED_IN_DIRECTION]
    assert summarize(words, ["lam 0.4", "lam 0.2", "lam 0.8", "lam 0.6"]) == (
        "reproduced in direction: 2 of 4 (lam 0.2, lam 0.6); not reproduced: 1 of 4 (lam 0.4); "
        "not testable here: 1 of 4 (lam 0.8)")
    assert summarize([REPRODUCED, UNDECIDED]) == "reproduced: 1 of 2; undecided: 1 of 2"
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="not verdict words"):
        summarize(["reproduced (borderline)"])
    with pytest.raises(ValueError, match="one to one"):
        summarize([REPRODUCED], ["a", "b"])
