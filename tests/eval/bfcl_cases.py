"""Completions to grade with both verispec's BFCL checker and the official one (bfcl-eval).

``cases(problem)`` is deterministic: the minimal answer, every allowed value of every parameter,
perturbed values (types, int/float, tuples, string normalization, empty lists ...), missing and
extra parameters, wrong names, positional arguments, reordered / dropped / repeated calls, and
text-level variants (code fences, tags, quotes, unary ``+``, folded arithmetic, sets ...).
Used by ``test_task_bfcl.py`` and ``scripts/bfcl_official_decisions.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from verispec.eval.tasks.bfcl import first_allowed_call, parse_calls

MODEL_NAME = "Qwen/Qwen3-8B"  # a prompting model in BFCL's config: function names are not rewritten


def _fmt(v: Any, hook: Callable[[Any], str | None] | None = None) -> str:
    """Python source for ``v``; ``hook`` may return other source for a value (None: default)."""
    if hook is not None:
        alt = hook(v)
        if alt is not None:
            return alt
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x, hook) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + "".join(_fmt(x, hook) + ", " for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_fmt(k)}: {_fmt(x, hook)}" for k, x in v.items()) + "}"
    return repr(v)


def render(calls, hook=None, positional: bool = False) -> str:
    parts = []
    for name, args in calls:
        inner = ", ".join(_fmt(v, hook) if positional else f"{k}={_fmt(v, hook)}" for k, v in args.items())
        parts.append(f"{name}({inner})")
    return "[" + ", ".join(parts) + "]"


def _variants(v: Any) -> list[Any]:
    """Values near ``v`` that a checker may accept or reject."""
    if type(v) is bool:
        out = [not v, int(v), str(v)]
    elif type(v) is int:
        out = [float(v), str(v), v + 1, True if v == 1 else -v]
    elif type(v) is float:
        out = [int(v) if v.is_integer() else round(v), str(v), v + 0.5]
    elif type(v) is str:
        out = [v.upper(), v + "  ", v.replace(" ", "_"), v + ".", v.replace("'", '"'), v + "x", 0]
    elif type(v) is list:
        out = [tuple(v), v[::-1], v[:-1], v + v[:1], [],
               [float(x) if type(x) is int else x for x in v],
               [int(x) if type(x) is float and x.is_integer() else x for x in v],
               [x.upper() if type(x) is str else x for x in v], [str(x) for x in v], tuple(map(str, v))]
    elif type(v) is dict:
        keys = list(v)
        out = [{k: v[k] for k in keys[1:]}, {**v, "zzz": 1},
               {k: x.upper() if type(x) is str else x for k, x in v.items()}, [v]]
    else:
        out = [0, "None"]
    seen = {repr(v)}
    uniq = []
    for x in out:
        if repr(x) not in seen:
            seen.add(repr(x))
            uniq.append(x)
    return uniq


def _kind(v: Any, alt: Any) -> str:
    """A short name for the change from ``v`` to ``alt``."""
    if type(alt) is not type(v):
        return type(alt).__name__
    return "other value"


def _plus(v):
    return f"+{v!r}" if type(v) in (int, float) and v >= 0 else None


def _neg_neg(v):
    return f"-(-{v!r})" if type(v) in (int, float) and v > 0 else None


def _minus_const(v):
    return f"-{-v!r}" if type(v) in (int, float) and v < 0 else None


def _arith(v):
    if type(v) is int:
        return f"({v!r} * 2 - {v!r})"
    if type(v) is float:
        return f"({v!r} + 0)"
    return None


def _concat(v):
    return f"{v[:1]!r} + {v[1:]!r}" if type(v) is str and len(v) >= 2 else None


def _set(v):
    if type(v) is list and v and all(type(x) in (int, float, str, bool) for x in v) and len(set(v)) == len(v):
        return "{" + ", ".join(repr(x) for x in v) + "}"
    return None


def _name(v):
    return v if type(v) is str and v.isidentifier() and v not in ("True", "False", "None") else None


def _subscript(v):
    return f"{v}[0]" if type(v) is str and v.isidentifier() and v not in ("True", "False", "None") else None


def _call_text(v):
    return f"str({v!r})" if type(v) in (int, float) else None


HOOKS = [_plus, _neg_neg, _minus_const, _arith, _concat, _set, _name, _subscript, _call_text]


def labelled_cases(problem) -> list[tuple[str, str]]:
    """(kind, completion) pairs for one BFCL problem, deterministic; the first kind of each text is kept."""
    gt = problem.reference["ground_truth"]
    functions = problem.reference["functions"]
    docs = {f["name"]: f for f in functions}
    base = parse_calls(first_allowed_call(gt, functions))
    out: list[tuple[str, str]] = [("minimal answer", render(base))]

    def with_arg(i: int, key: str, value: Any = None, drop: bool = False) -> list:
        calls = [(n, dict(a)) for n, a in base]
        if drop:
            calls[i][1].pop(key, None)
        else:
            calls[i][1][key] = value
        return calls

    for i, entry in enumerate(gt):
        name, params = next(iter(entry.items()))
        props = docs.get(name, {}).get("parameters", {}).get("properties", {})
        for key, options in params.items():
            for opt in options:  # every allowed value ("" = leave the parameter out)
                calls = with_arg(i, key, drop=True) if opt == "" else with_arg(i, key, opt)
                out.append(("allowed value", render(calls)))
            first = next((o for o in options if o != ""), None)
            if first is not None:
                for alt in _variants(first):
                    out.append((f"{type(first).__name__} -> {_kind(first, alt)}", render(with_arg(i, key, alt))))
            out.append(("parameter left out", render(with_arg(i, key, drop=True))))
        for key in props:  # a documented parameter the answer does not allow
            if key not in params:
                out.append(("documented parameter not in the answer", render(with_arg(i, key, 1))))
                break
        out.append(("unknown parameter", render(with_arg(i, "zzz_unknown", 1))))
        renamed = [(n, a) for n, a in base]
        renamed[i] = (name + "_x", base[i][1])
        out.append(("wrong function name", render(renamed)))
        renamed[i] = ("mod." + name, base[i][1])
        out.append(("extra dotted prefix", render(renamed)))
    out.append(("positional arguments", render(base, positional=True)))
    if len(base) > 1:
        out += [("calls reversed", render(base[::-1])), ("calls rotated", render(base[1:] + base[:1])),
                ("a call dropped", render(base[:-1])), ("a call repeated", render(base + base[:1]))]
        if base[0][0] == base[1][0]:  # swap each parameter's value between the first two calls
            for key in [k for k in base[0][1] if k in base[1][1]]:
                a, b = dict(base[0][1]), dict(base[1][1])
                a[key], b[key] = b[key], a[key]
                out.append(("values swapped between calls", render([(base[0][0], a), (base[1][0], b), *base[2:]])))
    else:
        out += [("a call repeated", render(base + base)), ("no call", "[]")]
    other = next((f["name"] for f in functions if f["name"] != base[0][0]), None)
    if other is not None:
        out.append(("another documented function", render([(other, base[0][1]), *base[1:]])))
    text = render(base)
    out += [("```python fence", f"```python\n{text}\n```"), ("``` fence", f"```\n{text}\n```"),
            ("<TOOLCALL> tags", f"<TOOLCALL>{text}</TOOLCALL>"), ("quoted", f"'{text}'"),
            ("leading prose", f"Sure! {text}"), ("trailing newline", f"{text}\n"), ("leading tab", f"\t{text}"),
            ("no brackets", text[1:-1]), ("no brackets, spaces", f" {text[1:-1]} "), ("double brackets", f"[{text}]")]
    out += [(f"syntax: {hook.__name__.strip('_')}", render(base, hook)) for hook in HOOKS]
    first_kind: dict[str, str] = {}
    for kind, t in out:
        first_kind.setdefault(t, kind)
    return [(kind, t) for t, kind in first_kind.items()]


def cases(problem) -> list[str]:
    """All completions to compare for one BFCL problem (deterministic, duplicates removed)."""
    return [t for _, t in labelled_cases(problem)]


def cases_digest(texts: list[str]) -> str:
    """A short hash of a problem's case list (to tell when recorded decisions are stale)."""
    return hashlib.sha1("\x00".join(texts).encode()).hexdigest()[:12]
