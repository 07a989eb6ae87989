"""Parameter checks shared by the rules: each raises ValueError naming the parameter and its range."""

from __future__ import annotations

import math


def _finite(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_l(value: float) -> None:
    if not 0 < _finite("l", value) <= 1:
        raise ValueError(f"l (lenience) must be in (0, 1], got {value}")


def check_lam(value: float) -> None:
    if not 0 <= _finite("lam", value) <= 1:
        raise ValueError(f"lam (lambda) must be in [0, 1], got {value}")


def check_p_base(value: float) -> None:
    if not 0 < _finite("p_base", value) <= 1:
        raise ValueError(f"p_base must be in (0, 1], got {value}")


def check_epsilon(value: float) -> None:
    if not 0 < _finite("epsilon", value) <= 1:
        raise ValueError(f"epsilon must be in (0, 1], got {value}")


def check_delta(value: float | None) -> None:
    if value is not None and not 0 < _finite("delta", value) <= 1:
        raise ValueError(f"delta must be in (0, 1], got {value}")
