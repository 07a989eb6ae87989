"""BFCL v4 function calling, Python AST categories (``bfcl-eval==2026.3.23``'s data files).

Data: ``bfcl_eval/data/BFCL_v4_{simple_python,multiple,parallel,parallel_multiple}.json`` (one
JSON object per line: ``question``, ``function`` docs) and the same names under
``data/possible_answer/`` (``ground_truth``: ``[{func: {param: [allowed values]}}]``, ``""`` in a
list marks the parameter optional). 400/200/200/200 entries. ``bfcl_eval`` is installed with
``--no-deps`` and never imported; this module is our own code, written after reading BFCL's
``ast_checker.py``.

Prompt: a system message modelled on BFCL's default prompting prompt (functions as JSON, answer
only with ``[func(a=1), other(b="x")]``), then the entry's first-turn messages.
``load(limit)`` interleaves the chosen categories round-robin (``subset``: category names).

Grader: the completion (fences and ``<TOOLCALL>`` tags removed, wrapped in ``[...]`` if needed)
is parsed with ``ast`` (never ``eval``); arguments must be keywords and literal values (names
become strings, numeric ``+ - * / **`` of literals are folded, a nested call becomes its source
text). Each call is checked as BFCL does: the function name; required parameters present; no
parameter the doc or the possible answer lacks; types (``int`` accepted for ``float``, also
inside lists — BFCL only at top level; tuple accepted as list); values in the allowed list,
strings compared after BFCL's normalization (lower case, drop spaces and ``,./-_*^``, ``'``→``"``),
lists element-wise in order, dicts key by key; absent optional parameters need ``""`` allowed.
simple/multiple need exactly one call; parallel categories need as many calls as the ground
truth, matched in any order (a perfect matching; BFCL matches greedily).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from verispec.eval.tasks.base import Grade, Problem, as_list, package_dir, take

CATEGORIES: dict[str, str] = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
}

SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose. If none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out. You should only "
    "return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. "
    "Use Python syntax for the values. You SHOULD NOT include any other text in the response.\n\n"
    "Here is a list of functions in JSON format that you can invoke.\n{functions}\n"
)

_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "any": str,
}
Call = tuple[str, dict[str, Any]]


class CallParseError(ValueError):
    """The completion is not a list of keyword-argument calls with literal values."""


def _read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _func_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise CallParseError("function name is not a dotted name")
    parts.append(node.id)
    return ".".join(reversed(parts))


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
           ast.Pow: lambda a, b: a ** b, ast.Mod: lambda a, b: a % b}


def _value(node: ast.expr) -> Any:
    """A literal value from an argument node (the safe subset BFCL accepts)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _value(node.operand)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise CallParseError("unary minus on a non-number")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.List | ast.Set):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise CallParseError("dict unpacking")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name):
        return node.id  # a variable: BFCL keeps its name as a string
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _value(node.left), _value(node.right)
        nums = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
        if not nums or (isinstance(node.op, ast.Pow) and abs(b) > 64):
            raise CallParseError("unsupported arithmetic in an argument")
        try:
            return _BINOPS[type(node.op)](a, b)
        except (ZeroDivisionError, OverflowError) as e:
            raise CallParseError(str(e)) from None
    if isinstance(node, ast.Call):
        if node.keywords:
            name, args = _call(node)
            return {name: args}
        return ast.unparse(node)
    raise CallParseError(f"unsupported argument syntax: {type(node).__name__}")


def _call(node: ast.expr) -> Call:
    if not isinstance(node, ast.Call):
        raise CallParseError("expected a function call")
    if node.args:
        raise CallParseError("positional arguments are not accepted; use keywords")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallParseError("**kwargs are not accepted")
        args[kw.arg] = _value(kw.value)
    return _func_name(node.func), args


def parse_calls(text: str) -> list[Call]:
    """Parse ``[f(a=1), g.h(b="x")]`` (or a bare ``f(a=1)``) into ``[(name, kwargs)]``."""
    s = text.strip()
    fence = re.search(r"```[a-zA-Z]*\n?(.*?)(?:```|\Z)", s, re.S)
    if fence:
        s = fence.group(1).strip()
    tag = re.search(r"<TOOLCALL>(.*?)(?:</TOOLCALL>|\Z)", s, re.S)
    if tag:
        s = tag.group(1).strip()
    s = s.strip("`'\n ")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    try:
        tree = ast.parse(s, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CallParseError(f"not Python: {e}") from None
    body = tree.body
    elts = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    return [_call(e) for e in elts]


def standardize(s: str) -> str:
    """BFCL's string normalization: drop spaces and ``,./-_*^``, lower case, ``'`` → ``"``."""
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if isinstance(v, str) else v


def _dict_ok(value: dict, allowed: list) -> bool:
    for option in allowed:
        if not isinstance(option, dict):
            continue
        if all(k in option and _std(v) in [_std(x) for x in option[k]] for k, v in value.items()) \
                and all(k in value or "" in vs for k, vs in option.items()):
            return True
    return False


def _type_ok(value: Any, doc_type: str, item_type: str | None, allowed: list) -> tuple[bool, Any, bool]:
    """(ok, possibly converted value, is_variable) following BFCL's type checker."""
    want = _PY_TYPES.get(doc_type, str)
    if doc_type == "float" and type(value) is int:
        value = float(value)
    if doc_type == "tuple" and isinstance(value, tuple):
        value = list(value)
    if isinstance(value, tuple):
        value = list(value)
    answer_type = next((type(a) for a in allowed if a != ""), None)
    is_variable = answer_type is not None and answer_type is not want
    if type(value) is want:
        if want is list and item_type in _PY_TYPES:
            inner = _PY_TYPES[item_type]
            if item_type == "float":
                value = [float(x) if type(x) is int else x for x in value]
            if all(type(x) is inner for x in value):
                return True, value, is_variable
            # BFCL falls through here: a list still passes "as a variable" (raw comparison)
        else:
            return True, value, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, value, True
    return False, value, is_variable


def check_call(doc: dict, call: Call, expected: dict[str, dict[str, list]]) -> str | None:
    """None if ``call`` satisfies the ground-truth entry ``expected``, else the reason."""
    exp_name, allowed = next(iter(expected.items()))
    name, args = call
    if name != exp_name:
        return f"wrong function {name!r}, expected {exp_name!r}"
    params = doc.get("parameters", {})
    props = params.get("properties", {})
    for req in params.get("required", []):
        if req not in args:
            return f"missing required parameter {req!r}"
    for p, value in args.items():
        if p not in props or p not in allowed:
            return f"unexpected parameter {p!r}"
        doc_type = props[p].get("type", "any")
        item_type = (props[p].get("items") or {}).get("type")
        ok, value, is_var = _type_ok(value, doc_type, item_type, allowed[p])
        if not ok:
            return f"wrong type for {p!r}: {type(value).__name__}, expected {doc_type}"
        opts = allowed[p]
        if not is_var and isinstance(value, dict):
            good = _dict_ok(value, opts)
        elif not is_var and isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            good = any(isinstance(o, list) and len(o) == len(value)
                       and all(_dict_ok(v, [d]) for v, d in zip(value, o, strict=True)) for o in opts)
        elif not is_var and isinstance(value, str):
            good = standardize(value) in [standardize(o) for o in opts if isinstance(o, str)]
        elif not is_var and isinstance(value, list):
            good = [_std(x) for x in value] in [[_std(x) for x in o] for o in opts if isinstance(o, list)]
        else:
            good = value in opts
        if not good:
            return f"value {value!r} for {p!r} not in {opts!r}"
    for p, opts in allowed.items():
        if p not in args and "" not in opts:
            return f"missing parameter {p!r}"
    return None


def _perfect_match(ok: list[list[bool]]) -> bool:
    """Is there a bijection expected[i] ↔ calls[j] with ok[i][j] for all pairs (Kuhn)."""
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j, good in enumerate(ok[i]):
            if good and j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(place(i, set()) for i in range(len(ok)))


def grade_calls(functions: list[dict], ground_truth: list[dict], calls: list[Call]) -> str | None:
    """None if ``calls`` answer the entry (any order), else the reason."""
    if len(calls) != len(ground_truth):
        return f"{len(calls)} call(s), expected {len(ground_truth)}"
    docs = {f["name"]: f for f in functions}
    reasons: list[str] = []
    table = []
    for exp in ground_truth:
        doc = docs.get(next(iter(exp)), {})
        row = []
        for call in calls:
            why = check_call(doc, call, exp)
            row.append(why is None)
            if why:
                reasons.append(why)
        table.append(row)
    if _perfect_match(table):
        return None
    return "; ".join(dict.fromkeys(reasons))[:500] or "no matching"


def _first(options: list) -> Any:
    """First allowed value that is not the "omit me" marker, recursing into dicts."""
    value = next((o for o in options if o != ""), "")
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if _first(v) != ""}
    if isinstance(value, list) and value and all(isinstance(d, dict) for d in value):
        return [{k: _first(v) for k, v in d.items() if _first(v) != ""} for d in value]
    return value


def first_allowed_call(ground_truth: list[dict], functions: list[dict] | None = None) -> str:
    """A minimal completion every ground truth should accept: each parameter gets its first
    allowed value (recursing into dicts), except that optional ones (``""`` allowed and not
    required by the function doc) are left out."""
    required = {f["name"]: set(f.get("parameters", {}).get("required", []))
                for f in functions or []}
    calls = []
    for entry in ground_truth:
        name, params = next(iter(entry.items()))
        args = {k: _first(v) for k, v in params.items()
                if "" not in v or k in required.get(name, set())}
        calls.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items() if v != '')})")
    return "[" + ", ".join(calls) + "]"


class BFCLTask:
    """BFCL (Python AST categories) as a :class:`~verispec.eval.tasks.base.Task`."""

    name = "bfcl"

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]:
        """Entries of the chosen categories (default all four), interleaved round-robin."""
        cats = as_list(subset) or list(CATEGORIES)
        data = package_dir("bfcl_eval") / "data"
        per = []
        for cat in cats:
            fname = CATEGORIES[cat]
            answers = {r["id"]: r["ground_truth"] for r in _read_jsonl(data / "possible_answer" / fname)}
            items = []
            for row in _read_jsonl(data / fname):
                system = SYSTEM_PROMPT.format(functions=json.dumps(row["function"], indent=2))
                items.append(Problem(
                    task=self.name, id=row["id"],
                    messages=[{"role": "system", "content": system}, *row["question"][0]],
                    reference={"functions": row["function"], "ground_truth": answers[row["id"]]},
                    meta={"category": cat},
                ))
            per.append(items)
        mixed = [ps[i] for i in range(max(map(len, per), default=0)) for ps in per if i < len(ps)]
        return take(mixed, limit)

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        """Parse the calls with ``ast`` and check them like BFCL's AST checker."""
        try:
            calls = parse_calls(completion_text)
        except CallParseError as e:
            return Grade(False, 0.0, f"unparseable: {e}", None)
        shown = "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                                for n, a in calls) + "]"
        why = grade_calls(problem.reference["functions"], problem.reference["ground_truth"], calls)
        return Grade(why is None, float(why is None), why or "all calls match", shown)
