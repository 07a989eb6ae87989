"""Parameter checks shared by the rules: each raises ValueError naming the parameter and its range."""

from __future__ import annotations

import math


def _finite(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


#: every numeric rule parameter's range, (low, high, low open, high open): the one table the checks below read and
#: :func:`verispec.core.rules.describe` publishes (the server's page builds its inputs from it)
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "l": (0.0, 1.0, True, False),
    "lam": (0.0, 1.0, False, False),
    "p_base": (0.0, 1.0, True, False),
    "epsilon": (0.0, 1.0, True, False),
    "delta": (0.0, 1.0, True, False),
    "q_floor": (0.0, 1.0, True, True),
}
_LABELS = {"l": "l (lenience)", "lam": "lam (lambda)"}


Bounds = tuple[float, float, bool, bool]


def range_text(name: str, bounds: Bounds | None = None) -> str:
    """A parameter's range in interval notation, e.g. ``(0, 1]`` (``bounds``: a rule's own, else :data:`RANGES`)."""
    lo, hi, lo_open, hi_open = bounds or RANGES[name]
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def check_range(name: str, value: float, bounds: Bounds | None = None) -> None:
    """ValueError naming ``name`` and its range (``bounds``, default :data:`RANGES`) unless ``value`` is a finite
    number inside it."""
    lo, hi, lo_open, hi_open = bounds or RANGES[name]
    v = _finite(name, value)
    if (v < lo or (lo_open and v == lo)) or (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{_LABELS.get(name, name)} must be in {range_text(name, bounds)}, got {value}")


def check_l(value: float) -> None:
    check_range("l", value)


def check_lam(value: float) -> None:
    check_range("lam", value)


def check_p_base(value: float) -> None:
    check_range("p_base", value)


def check_epsilon(value: float) -> None:
    check_range("epsilon", value)


def check_delta(value: float | None) -> None:
    if value is not None:
        check_range("delta", value)
