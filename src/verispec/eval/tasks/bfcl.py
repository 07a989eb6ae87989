"""BFCL v4 function calling, Python AST categories (``bfcl-eval==2026.3.23``'s data files).

Data: ``bfcl_eval/data/BFCL_v4_{simple_python,multiple,parallel,parallel_multiple}.json`` (one
JSON object per line: ``question``, ``function`` docs) and the same names under
``data/possible_answer/`` (``ground_truth``: ``[{func: {param: [allowed values]}}]``, ``""`` in a
list marks the parameter optional). 400/200/200/200 entries. ``bfcl_eval`` is installed with
``--no-deps`` and never imported; this module is our own code, written after reading BFCL's
``ast_checker.py`` and its prompting decoder (``model_handler/utils.py``).

Prompt: a system message modelled on BFCL's default prompting prompt (functions as JSON, answer
only with ``[func(a=1), other(b="x")]``), then the entry's first-turn messages.
``load(limit)`` interleaves the chosen categories round-robin (``subset``: category names).

Grader: by default it takes the same accept/reject decision as bfcl-eval's own pipeline for a
prompting model (``default_decode_ast_prompting`` then ``ast_checker``); the differences left, all
on inputs the official code evaluates with ``eval`` or crashes on, are listed in
``docs/results/bfcl_checker.md``. Decoding: strip backticks, newlines and spaces from both ends,
wrap in ``[...]``, parse with ``ast`` (never ``eval``); each element must be a call; keyword
arguments become the call's parameters (positional ones are dropped, as BFCL does); values are
literals, names become strings, a nested call becomes its source text (or ``{name: kwargs}`` if it
has keywords), a subscript its source text, arithmetic on literals is folded, and any unary
operator on a constant negates it (BFCL's decoder: ``+5`` reads as ``-5``). Checking, per call:
the function name; required parameters present; no parameter the doc or the possible answer
lacks; types (``int`` accepted for a ``float`` parameter, a tuple for a ``tuple`` parameter;
list elements checked against each allowed list as BFCL does); values in the allowed list,
strings compared after BFCL's normalization (lower case, drop spaces and ``,./-_*^``,
``'``→``"``), lists element-wise in order, dicts key by key; absent parameters need ``""``
allowed. simple/multiple need exactly one call; parallel categories need as many calls as the
ground truth, each ground-truth entry in turn taking the first unused call that fits (BFCL's
greedy matching).

``lenient=True`` (off by default) restores verispec's former readings: the answer is taken out
of a Markdown code fence or ``<TOOLCALL>`` tags, quotes and any surrounding whitespace are
dropped, ``int`` is accepted inside ``float`` lists and a tuple for any list parameter, a set
literal reads as a list, unary operators mean what Python means (so ``+1`` is 1, where BFCL reads
-1), and parallel calls are matched by any perfect matching instead of greedily.
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
    """The completion is not a list of calls whose arguments are literal values."""


def _read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------- decoding

def _func_name(node: ast.expr) -> str:
    """The dotted name of a called function; a base that is not a plain name is dropped (as BFCL
    does), so ``f()(a=1)`` is called ``""`` and never matches a ground truth."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b, ast.LShift: lambda a, b: a << b,
           ast.RShift: lambda a, b: a >> b, ast.BitOr: lambda a, b: a | b,
           ast.BitXor: lambda a, b: a ^ b, ast.BitAnd: lambda a, b: a & b}
_UNARY = {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Not: lambda v: not v,
          ast.Invert: lambda v: ~v}
_MAX_LEN = 100_000  # the longest str/bytes/list/tuple that folding a BinOp may build
_MAX_BITS = 100_000  # the largest int (in bits) that folding a BinOp may build


def _is_int(v: Any) -> bool:
    return isinstance(v, int)  # bool included: Python (and BFCL's eval) computes True + 1 == 2


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    """``a op b`` as Python computes it, refusing results too large to build."""
    kind = type(op)
    if kind not in _BINOPS:
        raise CallParseError(f"unsupported operator {kind.__name__}")
    if kind is ast.Mod and isinstance(a, str | bytes):
        raise CallParseError("%-formatting is not folded")
    if kind is ast.Mult:
        seq, n = (a, b) if isinstance(a, str | bytes | list | tuple) else (b, a)
        if isinstance(seq, str | bytes | list | tuple) and _is_int(n) and len(seq) * n > _MAX_LEN:
            raise CallParseError("repetition too long")
    if kind is ast.Pow and _is_int(a) and _is_int(b) and b > 0 and a.bit_length() * b > _MAX_BITS:
        raise CallParseError("power too large")
    if kind is ast.LShift and _is_int(a) and _is_int(b) and a.bit_length() + b > _MAX_BITS:
        raise CallParseError("shift too large")
    return _BINOPS[kind](a, b)


def _literal(node: ast.expr) -> Any:
    """The value Python gives a literal expression (constants, containers, operators on them).

    BFCL folds a BinOp argument with ``eval(ast.unparse(node))``; this computes the same value for
    literal operands without evaluating anything else: a name or a call inside arithmetic is
    refused (BFCL's ``eval`` would look it up or run it)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Set):
        return {_literal(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise CallParseError("dict unpacking")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_literal(node.operand))
    if isinstance(node, ast.BinOp):
        return _binop(node.op, _literal(node.left), _literal(node.right))
    raise CallParseError(f"{type(node).__name__} inside arithmetic is not folded")


def _value(node: ast.expr, lenient: bool) -> Any:
    """An argument's value, read the way BFCL's ``resolve_ast_by_type`` reads it."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        if lenient:
            return _literal(node)
        # BFCL computes ``-node.operand.value`` whatever the operator: +5 and ~5 read as -5, and
        # only a constant operand works (-x, -(1+2) and -"s" fail to decode).
        if not isinstance(node.operand, ast.Constant):
            raise CallParseError("unary operator on a non-constant")
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_value(e, lenient) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, lenient) for e in node.elts)
    if isinstance(node, ast.Set):
        if lenient:
            return [_value(e, lenient) for e in node.elts]
        raise CallParseError("a set literal is not accepted")
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise CallParseError("dict unpacking")
        return {_value(k, lenient): _value(v, lenient) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.BinOp):
        return _literal(node)
    if isinstance(node, ast.Name):
        return node.id  # a variable: BFCL keeps its name as a string
    if isinstance(node, ast.Call):
        if node.keywords:
            name, args = _call(node, lenient)
            return {name: args}
        return ast.unparse(node)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise CallParseError(f"unsupported argument syntax: {type(node).__name__}")


def _call(node: ast.Call, lenient: bool) -> Call:
    """(name, keyword arguments). Positional arguments are dropped and ``**x`` is kept under the
    key None, as BFCL does (the checker then rejects it as an unexpected parameter)."""
    args: dict[Any, Any] = {}
    for kw in node.keywords:
        args[kw.arg] = _value(kw.value, lenient)
    return _func_name(node.func), args


def parse_calls(text: str, lenient: bool = False) -> list[Call]:
    """Parse ``[f(a=1), g.h(b="x")]`` (or a bare ``f(a=1)``) into ``[(name, kwargs)]``.

    Default: what BFCL's ``default_decode_ast_prompting`` decodes. ``lenient``: also take the
    answer out of a Markdown code fence or ``<TOOLCALL>`` tags and drop quotes around it (see the
    module docstring for the rest)."""
    if lenient:
        s = text.strip()
        fence = re.search(r"```[a-zA-Z]*\n?(.*?)(?:```|\Z)", s, re.S)
        if fence:
            s = fence.group(1).strip()
        tag = re.search(r"<TOOLCALL>(.*?)(?:</TOOLCALL>|\Z)", s, re.S)
        if tag:
            s = tag.group(1).strip()
        s = s.strip("`'\n ")
    else:
        s = text.strip("`\n ")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    try:
        body = ast.parse(s, mode="eval").body
        if not isinstance(body, ast.List | ast.Tuple | ast.Set):
            raise CallParseError("not a list of calls")
        if not all(isinstance(e, ast.Call) for e in body.elts):
            raise CallParseError("expected a list of function calls")
        return [_call(e, lenient) for e in body.elts]
    except CallParseError:
        raise
    except SyntaxError as e:
        raise CallParseError(f"not Python: {e}") from None
    except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as e:
        raise CallParseError(f"{type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------- checking

def standardize(s: str) -> str:
    """BFCL's string normalization: drop spaces and ``,./-_*^``, lower case, ``'`` → ``"``."""
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if type(v) is str else v


def _answer_type(options: list) -> type | None:
    """The type of the first allowed value that is not the ``""`` (optional) marker."""
    return next((type(o) for o in options if o != ""), None)


def _type_ok(value: Any, doc_type: str, item_type: str | None, allowed: list, lenient: bool
             ) -> tuple[bool, Any, bool]:
    """(ok, value after BFCL's conversions, is_variable), following BFCL's ``type_checker``.

    ``is_variable``: the possible answers are not of the documented type (e.g. strings for an
    integer parameter), so the value is later compared as is, without normalization."""
    want = _PY_TYPES.get(doc_type, str)
    if type(value) is tuple and (doc_type == "tuple" or (lenient and want is list)):
        value = list(value)
    if doc_type == "float" and type(value) is int:
        value = float(value)
    if lenient and want is list and item_type == "float" and type(value) is list:
        value = [float(x) if type(x) is int else x for x in value]
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not want
    if type(value) is want:
        if doc_type not in ("array", "tuple"):
            return True, value, is_variable
        inner = _PY_TYPES.get(item_type or "", str)
        # One level of element types, against each allowed value in turn: the elements must all
        # have the item type (or the type of that allowed list's first element). An allowed value
        # that is not a list -- the "" marker of an optional parameter -- lets any elements pass.
        for option in allowed:
            if type(option) is not list:
                return True, value, is_variable
            t = _answer_type(option)
            if all(type(x) is inner or type(x) is t for x in value):
                return True, value, is_variable
        return False, value, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, value, True
    return False, value, is_variable


def _dict_ok(value: dict, allowed: list) -> bool:
    """Some allowed dict has every key of ``value`` with an allowed (normalized) value, and every
    key ``value`` lacks is optional there."""
    for option in allowed:
        if not isinstance(option, dict):
            continue
        if all(k in option and _std(v) in [_std(x) for x in option[k]] for k, v in value.items()) \
                and all(k in value or "" in vs for k, vs in option.items()):
            return True
    return False


def _list_of_dicts_ok(value: list, allowed: list) -> bool:
    """Element by element against an allowed list of the same length. BFCL compares lengths with
    ``len``, so the ``""`` marker (length 0) accepts an empty list."""
    for option in allowed:
        if type(option) is str and not option and not value:
            return True
        if type(option) is list and len(option) == len(value) and all(
                isinstance(v, dict) and _dict_ok(v, [d]) for v, d in zip(value, option, strict=True)):
            return True
    return False


def _list_ok(value: list, allowed: list) -> bool:
    """Equal, in order, to an allowed list after normalizing string elements. BFCL walks an allowed
    string character by character, so the ``""`` marker accepts an empty list."""
    got = [_std(x) for x in value]
    for option in allowed:
        if type(option) is list:
            expected = [_std(x) for x in option]
        elif type(option) is str:
            expected = [standardize(c) for c in option]
        else:
            continue
        if got == expected:
            return True
    return False


def _value_ok(value: Any, doc_type: str, item_type: str | None, allowed: list, is_variable: bool
              ) -> bool:
    want = _PY_TYPES.get(doc_type, str)
    if is_variable:
        return value in allowed
    if want is dict:
        return _dict_ok(value, allowed)
    if want is list and _PY_TYPES.get(item_type or "") is dict:
        return _list_of_dicts_ok(value, allowed)
    if want is str:
        return standardize(value) in [standardize(o) for o in allowed if type(o) is str]
    if want is list:
        return _list_ok(value, allowed)
    return value in allowed


def check_call(doc: dict, call: Call, expected: dict[str, dict[str, list]], lenient: bool = False
               ) -> str | None:
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
        ok, value, is_var = _type_ok(value, doc_type, item_type, allowed[p], lenient)
        if not ok:
            return f"wrong type for {p!r}: {type(value).__name__}, expected {doc_type}"
        if not _value_ok(value, doc_type, item_type, allowed[p], is_var):
            return f"value {value!r} for {p!r} not in {allowed[p]!r}"
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


def grade_calls(functions: list[dict], ground_truth: list[dict], calls: list[Call],
                lenient: bool = False) -> str | None:
    """None if ``calls`` answer the entry (any order), else the reason.

    Default: BFCL's greedy matching -- each ground-truth entry in turn takes the first call not
    yet taken that fits it. ``lenient``: any perfect matching will do."""
    if len(calls) != len(ground_truth):
        return f"{len(calls)} call(s), expected {len(ground_truth)}"
    docs = {f["name"]: f for f in functions}
    reasons: list[str] = []
    if lenient:
        table = []
        for exp in ground_truth:
            doc = docs.get(next(iter(exp)), {})
            row = []
            for call in calls:
                why = check_call(doc, call, exp, lenient=True)
                row.append(why is None)
                if why:
                    reasons.append(why)
            table.append(row)
        if _perfect_match(table):
            return None
        return "; ".join(dict.fromkeys(reasons))[:500] or "no matching"
    taken: set[int] = set()
    for exp in ground_truth:
        doc = docs.get(next(iter(exp)), {})
        for j, call in enumerate(calls):
            if j in taken:
                continue
            why = check_call(doc, call, exp)
            if why is None:
                taken.add(j)
                break
            reasons.append(why)
        else:
            return "; ".join(dict.fromkeys(reasons))[:500] or "no matching"
    return None


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
    """BFCL (Python AST categories) as a :class:`~verispec.eval.tasks.base.Task`.

    ``lenient=False`` (the default) takes BFCL's own accept/reject decisions; ``lenient=True``
    adds verispec's former leniencies (module docstring, ``docs/results/bfcl_checker.md``)."""

    name = "bfcl"

    def __init__(self, lenient: bool = False) -> None:
        self.lenient = lenient

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
            calls = parse_calls(completion_text, lenient=self.lenient)
        except CallParseError as e:
            return Grade(False, 0.0, f"unparseable: {e}", None)
        shown = "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                                for n, a in calls) + "]"
        why = grade_calls(problem.reference["functions"], problem.reference["ground_truth"], calls,
                          lenient=self.lenient)
        return Grade(why is None, float(why is None), why or "all calls match", shown)
