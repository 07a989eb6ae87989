"""Registry of verification rules: ``get(name, **params)``.

Parameter names follow the papers: ``l`` (lenience), ``lam`` (lambda; ``lambda`` is accepted too),
``p_base`` (min-p), ``epsilon`` and ``delta`` (eta), and ``correction`` ("draft" or "target") for the
truncation-based rules. Choices the papers leave open are parameters too: ``realization`` ("normalized" or
"residual") for the rules whose reference P is not a distribution, ``draft_truncation`` ("none" or "same") for
the matched baselines, ``acceptance`` ("indicator" or "ratio", Eq. 28) for typical acceptance.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any

from verispec.core.rules.base import ReferenceRule, Rule, UnnormalizedReferenceRule
from verispec.core.rules.collaborative import (
    AdaptiveInterpolation,
    Ceiling,
    CosCD,
    CosWE,
    Lenience,
    MinPCap,
    OvershootCeiling,
)
from verispec.core.rules.lossless import EtaSampling, Lossless, MinPSampling, NaiveResample
from verispec.core.rules.truncation import SpecCascade, TruncationRule, Typical
from verispec.core.rules.validate import RANGES
from verispec.registry import Registry, UnknownName

__all__ = [
    "REGISTRY",
    "ReferenceRule",
    "Rule",
    "TruncationRule",
    "UnnormalizedReferenceRule",
    "RequestError",
    "describe",
    "from_request",
    "get",
    "matched_baseline",
    "names",
    "parse_params",
    "table",
]

REGISTRY: Registry[type[Rule]] = Registry("rule", [
    (cls.name, cls)
    for cls in (
        Lossless,
        NaiveResample,
        MinPSampling,
        EtaSampling,
        Lenience,
        CosWE,
        CosCD,
        OvershootCeiling,
        AdaptiveInterpolation,
        Ceiling,
        MinPCap,
        SpecCascade,
        Typical,
    )
])

_ALIASES = {"lambda": "lam", "correction": "correction_source", "eps": "epsilon", "acceptance": "acceptance_form"}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str, **params: object) -> Rule:
    """Build the rule registered as ``name`` with ``params`` (validated; unknown names raise ValueError). A rule
    object is returned as is; parameters given with it are refused (ValueError naming them), not dropped."""
    if isinstance(name, Rule):
        if params:
            raise ValueError(f"parameter(s) {', '.join(sorted(params))} given with the rule object {name.describe()}; "
                             f"pass the rule's name to build it with them")
        return name
    cls = REGISTRY[name]
    kwargs = {_ALIASES.get(k, k): v for k, v in params.items()}
    unknown = set(kwargs) - set(cls.param_names)
    if unknown:
        allowed = ", ".join(cls.param_names) or "none"
        raise ValueError(f"rule {name!r} has no parameter(s) {', '.join(sorted(unknown))}; it takes: {allowed}")
    return cls(**kwargs)


class RequestError(ValueError):
    """A bad ``verification`` object; ``param`` names the field (``verification.rule`` / ``.params`` / the
    object itself), so that servers can answer 400 with it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def from_request(obj: object, where: str = "verification") -> Rule:
    """The rule a request's ``verification`` object asks for: ``{"rule": NAME, "params": {...}}`` (missing or
    None: lossless). Shared by ``verispec serve`` and the vLLM plug-in; :class:`RequestError` names the field."""
    if obj is None:
        return Lossless()
    if isinstance(obj, Rule):
        return obj
    if not isinstance(obj, dict):
        raise RequestError(f"{where} must be an object {{\"rule\": ..., \"params\": {{...}}}}, got "
                           f"{type(obj).__name__}", where)
    unknown = set(obj) - {"rule", "params"}
    if unknown:
        raise RequestError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}; allowed: rule, params",
                           where)
    name = obj.get("rule", "lossless")
    if not isinstance(name, str) or name not in REGISTRY:
        raise RequestError(str(UnknownName("rule", name, REGISTRY)), f"{where}.rule")
    params = obj.get("params") or {}
    if not isinstance(params, dict):
        raise RequestError(f"{where}.params must be an object, got {type(params).__name__}", f"{where}.params")
    try:
        return get(name, **params)
    except (ValueError, TypeError) as exc:
        raise RequestError(f"{where}.params: {exc}", f"{where}.params") from None


def _coerce(value: str) -> object:
    low = value.strip().lower()
    if low in ("none", "null"):
        return None
    try:
        return float(value)
    except ValueError:
        return value.strip()


def parse_params(items: Iterable[str]) -> dict[str, object]:
    """Parse ``["l=0.5", "lambda=0.2"]`` (command-line form) into keyword arguments."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"parameter {item!r} is not of the form name=value")
        out[key.strip()] = _coerce(value)
    return out


def matched_baseline(rule: Rule, draft_truncation: str = "none") -> Rule:
    """The distribution-matched baseline of section 5: the lossless rule on the same truncated target.

    SpecCascade -> min-p sampling (same p_base); typical -> eta-sampling (same epsilon, delta); every other
    rule -> plain lossless SD. ``draft_truncation`` ("none": q untouched, the paper's protocol; "same": q
    truncated too) is passed to the truncation baselines; a rule that is already a baseline is returned as is.
    """
    if isinstance(rule, SpecCascade):
        return MinPSampling(p_base=rule.p_base, draft_truncation=draft_truncation)
    if isinstance(rule, Typical):
        return EtaSampling(epsilon=rule.epsilon, delta=rule.delta, draft_truncation=draft_truncation)
    if isinstance(rule, MinPSampling | EtaSampling):
        return rule
    return Lossless()


def table() -> list[dict[str, str]]:
    """One row per rule for documentation: name, parameters, equation, lossless or not."""
    return [
        {
            "name": cls.name,
            "params": ", ".join(p for p in cls.param_names) or "-",
            "equation": cls.equation,
            "lossless": "yes" if cls.lossless else "no",
        }
        for cls in REGISTRY.values()
    ]


def _param_schema(cls: type[Rule], name: str) -> dict[str, Any]:
    """One parameter of a rule as a JSON-schema fragment: its type, default, range (:data:`~.validate.RANGES`) or
    choices (the field's ``Literal``), and whether null is allowed."""
    hints = typing.get_type_hints(cls)
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    out: dict[str, Any] = {"default": field.default}
    hint = hints[name]
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if type(None) in args:
        out["nullable"] = True
    for arg in args:
        if typing.get_origin(arg) is typing.Literal:
            out.update(type="string", enum=list(typing.get_args(arg)))
        elif arg is float or arg is int:
            out["type"] = "number"
    bounds = cls.param_ranges.get(name, RANGES.get(name))
    if bounds is not None:
        lo, hi, lo_open, hi_open = bounds
        out["exclusiveMinimum" if lo_open else "minimum"] = lo
        out["exclusiveMaximum" if hi_open else "maximum"] = hi
    return out


def describe() -> dict[str, dict[str, Any]]:
    """Every registered rule as data, for clients that build forms from it (the server's page): name ->
    ``{"lossless", "equation", "doc", "params": {name: JSON-schema fragment}}``, parameters in documented order,
    each with its default and its range (the table the rules' checks use) or its choices."""
    out = {}
    for name, cls in REGISTRY.items():
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        out[name] = {"lossless": cls.lossless, "equation": cls.equation, "doc": " ".join(doc.split()),
                     "params": {p: _param_schema(cls, p) for p in cls.param_names}}
    return out
