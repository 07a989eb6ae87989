"""BFCL: per-category counts; reference calls pass; wrong names, values and shapes fail; the
default checker takes bfcl-eval's decisions (recorded, and live where bfcl-eval imports); each
``lenient=True`` difference and each remaining difference is pinned on a hand-written case."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from bfcl_cases import MODEL_NAME, cases, cases_digest, labelled_cases

from verispec.eval.tasks import Problem, get_task
from verispec.eval.tasks.bfcl import CATEGORIES, BFCLTask, CallParseError, first_allowed_call, parse_calls

TASK = get_task("bfcl")
LENIENT = BFCLTask(lenient=True)
COUNTS = {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200}


def _ref(p):
    return first_allowed_call(p.reference["ground_truth"], p.reference["functions"])


def test_counts_and_prompt():
    for cat, n in COUNTS.items():
        assert len(TASK.load(subset=cat)) == n
    mixed = TASK.load(limit=8)
    assert Counter(p.meta["category"] for p in mixed) == {c: 2 for c in CATEGORIES}
    p = TASK.load(subset="simple", limit=1)[0]
    assert p.id == "simple_python_0"
    assert p.messages[0]["role"] == "system" and "calculate_triangle_area" in p.messages[0]["content"]
    assert p.messages[1] == {"role": "user", "content":
                             "Find the area of a triangle with a base of 10 units and height of 5 units."}


@pytest.mark.parametrize("category", list(COUNTS))
def test_first_allowed_values_pass(category):
    for p in TASK.load(subset=category):
        grade = TASK.grade(p, _ref(p))
        assert grade.passed, (p.id, grade.detail)


def _scalar_mutation(ground_truth):
    """(call index, param, new value) changing one scalar argument to a disallowed value."""
    for i, entry in enumerate(ground_truth):
        for param, options in next(iter(entry.values())).items():
            v = next((o for o in options if o != ""), None)
            new = {str: lambda x: x + " zzz", bool: lambda x: not x,
                   int: lambda x: x + 12345, float: lambda x: x + 1234.5}.get(type(v))
            if new is not None and new(v) not in options:
                return i, param, new(v)
    return None


@pytest.mark.parametrize("category", list(COUNTS))
def test_wrong_name_and_wrong_value_fail(category):
    mutated = 0
    for p in TASK.load(subset=category):
        gt = p.reference["ground_truth"]
        name = next(iter(gt[0]))
        ref = _ref(p)
        assert not TASK.grade(p, ref.replace(name + "(", name + "_x(", 1)).passed, p.id
        m = _scalar_mutation(gt)
        if m is None:
            continue
        i, param, value = m
        calls = parse_calls(ref)
        calls[i][1][param] = value
        assert not TASK.grade(p, _render(calls)).passed, (p.id, calls)
        mutated += 1
    assert mutated >= 0.9 * COUNTS[category]


def test_shapes():
    p = TASK.load(subset="simple", limit=1)[0]  # calculate_triangle_area(base=10, height=5)
    ok = [
        "[calculate_triangle_area(base=10, height=5)]",
        "calculate_triangle_area(base=10, height=5)",
        "```\n[calculate_triangle_area(height=5, base=10, unit='units')]\n```",
        "[calculate_triangle_area(base=10, height=5, unit='Units')]",
        "[calculate_triangle_area(base=5*2, height=5)]",
        "[calculate_triangle_area(base=10, height=5, unit='unit' + 's')]",
    ]
    bad = [
        "[calculate_triangle_area(10, 5)]",  # positional arguments are dropped: required ones missing
        "[calculate_triangle_area(base=10)]",  # missing required
        "[calculate_triangle_area(base=10, height=5, color='red')]",  # unknown param
        "[calculate_triangle_area(base=10.5, height=5)]",  # float for integer
        "[calculate_triangle_area(base='10', height=5)]",  # str for integer
        "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=10, height=5)]",
        "The area is 25.",
        "[__import__('os').system('echo hi')]",
        "```python\n[calculate_triangle_area(base=10, height=5)]\n```",  # lenient only
    ]
    for task in (TASK, LENIENT):
        for text in ok:
            assert task.grade(p, text).passed, text
        for text in bad[:-1]:
            assert not task.grade(p, text).passed, text
    assert not TASK.grade(p, bad[-1]).passed and LENIENT.grade(p, bad[-1]).passed


def _render(calls) -> str:
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                           for n, a in calls) + "]"


def test_float_accepts_int_and_parallel_order_is_free():
    for p in TASK.load(subset="parallel")[:50]:
        calls = parse_calls(_ref(p))
        assert len(calls) >= 2
        assert TASK.grade(p, _render(calls[::-1])).passed, p.id
        assert not TASK.grade(p, _render(calls[:-1])).passed, p.id  # a call missing
        assert not TASK.grade(p, _render([*calls, calls[0]])).passed, p.id  # one too many
    q = next(q for q in TASK.load(subset="parallel_multiple") if q.id == "parallel_multiple_12")
    text = ("[calculate_magnetic_field(current=4, distance=2), "
            "calculate_voltage_difference(electric_field=5, distance=3)]")
    assert TASK.grade(q, text).passed  # ints for float params


def test_parser_never_evaluates(tmp_path):
    marker = tmp_path / "pwned"
    calls = parse_calls(f"[f(x=__import__('os').system('touch {marker}'))]")
    assert calls == [("f", {"x": f"__import__('os').system('touch {marker}')"})]
    assert not marker.exists()
    with pytest.raises(CallParseError):
        parse_calls("[f(x=2**100000)]")
    with pytest.raises(CallParseError):
        parse_calls("[f(x=lambda: 1)]")
    with pytest.raises(CallParseError):  # an unhashable dict key used to raise TypeError out of grade()
        parse_calls("[f(x={[1]: 2})]")
    assert parse_calls("[f(x=open)]") == [("f", {"x": "open"})]


# ---------------------------------------------------------------- agreement with bfcl-eval

def _fn(name, props, required=()):
    return {"name": name, "description": "", "parameters": {
        "type": "dict", "properties": props, "required": list(required)}}


def _problem(functions, ground_truth, category="simple"):
    return Problem(task="bfcl", id="hand", messages=[],
                   reference={"functions": functions, "ground_truth": ground_truth},
                   meta={"category": category})


_FLOATS = _fn("f", {"xs": {"type": "array", "items": {"type": "float"}}}, ["xs"])
_INTS = _fn("f", {"xs": {"type": "array", "items": {"type": "integer"}}}, ["xs"])
_STRS = _fn("f", {"xs": {"type": "array", "items": {"type": "string"}}})
_DICTS = _fn("f", {"xs": {"type": "array", "items": {"type": "dict"}}})
_TUPLE = _fn("f", {"xs": {"type": "tuple", "items": {"type": "float"}}}, ["xs"])
_INT = _fn("f", {"n": {"type": "integer"}})
_STR = _fn("f", {"s": {"type": "string"}})
_G = _fn("g", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a"])
_TRIANGLE = [_fn("area", {"base": {"type": "integer"}, "height": {"type": "integer"}}, ["base", "height"])]
_TRIANGLE_GT = [{"area": {"base": [10], "height": [5]}}]

# (problem, completion, bfcl-eval's decision, lenient decision, why). The official decisions were
# checked by running bfcl-eval 2026.3.23's decoder and checker on each case.
HAND = [
    # lenient=True: the leniencies (official rejects, lenient accepts)
    (_problem(_TRIANGLE, _TRIANGLE_GT), "```python\n[area(base=10, height=5)]\n```", False, True,
     "a fence with a language tag: BFCL only strips backticks, so 'python' stays in front"),
    (_problem(_TRIANGLE, _TRIANGLE_GT), "<TOOLCALL>[area(base=10, height=5)]</TOOLCALL>", False, True,
     "tags are only removed for models that use them (has_tool_call_tag)"),
    (_problem(_TRIANGLE, _TRIANGLE_GT), "'[area(base=10, height=5)]'", False, True, "quotes around the answer"),
    (_problem(_TRIANGLE, _TRIANGLE_GT), "\t[area(base=10, height=5)]", False, True,
     "BFCL strips only backticks, newlines and spaces"),
    (_problem([_FLOATS], [{"f": {"xs": [[1.0, 2.0]]}}]), "[f(xs=[1, 2])]", False, True,
     "int inside a float list (BFCL converts int to float only at top level)"),
    (_problem([_FLOATS], [{"f": {"xs": [[1.0, 2.0]]}}]), "[f(xs=(1.0, 2.0))]", False, True,
     "a tuple for an array parameter"),
    (_problem([_TUPLE], [{"f": {"xs": [[1.0, 2.0]]}}]), "[f(xs=(1, 2))]", False, True,
     "int inside a tuple parameter"),
    (_problem([_FLOATS], [{"f": {"xs": [[1.0, 2.0]]}}]), "[f(xs={1.0, 2.0})]", False, True,
     "a set literal (BFCL's decoder has no case for ast.Set)"),
    (_problem([_INT], [{"f": {"n": [1, ""]}}]), "[f(n=+1)]", False, True, "BFCL reads +1 as -1"),
    (_problem([_INT], [{"f": {"n": [-1]}}]), "[f(n=-(-(-1)))]", False, True,
     "BFCL negates only a constant operand"),
    (_problem([_G], [{"g": {"a": [1], "b": [2, ""]}}, {"g": {"a": [1], "b": [""]}}], "parallel"),
     "[g(a=1), g(a=1, b=2)]", False, True,
     "greedy matching: the first entry takes g(a=1), which the second needed"),
    # lenient=True also rejects some things BFCL accepts (its unary-operator reading)
    (_problem([_INT], [{"f": {"n": [-1]}}]), "[f(n=+1)]", True, False, "BFCL reads +1 as -1"),
    (_problem([_INT], [{"f": {"n": [-1]}}]), "[f(n=not True)]", True, False, "BFCL computes -True"),
    (_problem([_INT], [{"f": {"n": [-1]}}]), "[f(n=~1)]", True, False, "BFCL computes -1 for ~1"),
    # both modes agree with BFCL where the old checker did not
    (_problem([_INTS], [{"f": {"xs": [[3, 5]]}}]), "[f(xs=[3.0, 5.0])]", False, False,
     "float elements in an integer list (the old checker compared [3.0, 5.0] == [3, 5])"),
    (_problem([_INTS], [{"f": {"xs": [[3, 5]]}}]), "[f(xs=[True, 5])]", False, False, "bool element (True == 1)"),
    (_problem([_FLOATS], [{"f": {"xs": [[1.0, 2.0], ""]}}]), "[f(xs=[1, 2])]", True, True,
     "an optional list: BFCL's element type check passes on the '' marker"),
    (_problem([_STRS], [{"f": {"xs": [["a"], ""]}}]), "[f(xs=[])]", True, True,
     "[] for an optional list: BFCL compares it with the characters of ''"),
    (_problem([_DICTS], [{"f": {"xs": [[{"k": ["v"]}], ""]}}]), "[f(xs=[])]", True, True,
     "[] for an optional list of dicts: len('') == 0"),
    (_problem([_INT], [{"f": {"n": [1, ""]}}]), "[f(1)]", True, True, "positional arguments are dropped"),
    (_problem([_STR], [{"f": {"s": ["ab"]}}]), "[f(s='a' + 'b')]", True, True, "arithmetic on literals is folded"),
    (_problem([_INT], [{"f": {"n": [6]}}]), "[f(n=True + 5)]", True, True, "as Python folds it"),
    (_problem([_STR], [{"f": {"s": ["ab[0]"]}}]), "[f(s=ab[0])]", True, True, "a subscript reads as its source"),
    (_problem([_INT], [{"f": {"n": [1]}}]), "[f(**{'n': 1})]", False, False, "**kwargs: an unexpected parameter"),
]

# Where verispec still differs from bfcl-eval (docs/results/bfcl_checker.md): bfcl-eval decides
# these with eval() or by crashing; verispec never evaluates code and rejects instead.
REMAINING = [
    (_problem([_INT], [{"f": {"n": [6]}}]), "[f(n=abs(-3) * 2)]", True,
     "arithmetic on a call: BFCL runs eval('abs(-3) * 2')"),
    (_problem([_STR], [{"f": {"s": ["ab"]}}]), "[f(s='%s' % 'ab')]", True, "%-formatting: BFCL evals it"),
    (_problem([_DICTS], [{"f": {"xs": [[{"k": ["v"]}], ""]}}]), "[f(xs=[1])]", None,
     "a non-dict in an optional list of dicts: BFCL's dict_checker raises AttributeError"),
]


@pytest.mark.parametrize("problem,text,official,lenient,why", HAND, ids=[h[-1][:40] for h in HAND])
def test_documented_differences(problem, text, official, lenient, why):
    assert TASK.grade(problem, text).passed is official, why
    assert LENIENT.grade(problem, text).passed is lenient, why


@pytest.mark.parametrize("problem,text,official,why", REMAINING, ids=[r[-1][:40] for r in REMAINING])
def test_remaining_differences_reject(problem, text, official, why):
    assert not TASK.grade(problem, text).passed, why
    assert not LENIENT.grade(problem, text).passed, why


RECORDED = Path(__file__).parent / "data" / "bfcl_official_decisions.json"
# kinds of case where lenient=True may accept what bfcl-eval rejects (bfcl_cases.labelled_cases)
LENIENT_KINDS = {"```python fence", "<TOOLCALL> tags", "quoted", "leading tab", "syntax: plus",
                 "syntax: neg_neg", "syntax: set", "list -> tuple", "list -> other value",
                 "calls reversed", "calls rotated", "values swapped between calls"}


def test_agrees_with_recorded_official_decisions():
    """Every case of bfcl_cases against bfcl-eval's recorded decision (scripts/bfcl_official_decisions.py)."""
    recorded = json.loads(RECORDED.read_text())["entries"]
    problems = TASK.load()
    assert set(recorded) == {p.id for p in problems}
    n = 0
    disagree, lenient_only = [], Counter()
    for p in problems:
        labelled = labelled_cases(p)
        digest, bits = recorded[p.id]
        assert digest == cases_digest([t for _, t in labelled]), \
            f"{p.id}: bfcl_cases changed; rerun scripts/bfcl_official_decisions.py"
        for (kind, text), bit in zip(labelled, bits, strict=True):
            n += 1
            official = bit == "1"
            if TASK.grade(p, text).passed != official:
                disagree.append((p.id, kind, text, official))
            lenient = LENIENT.grade(p, text).passed
            if lenient != official:
                assert lenient and kind in LENIENT_KINDS, (p.id, kind, text, official)
                lenient_only[kind] += 1
    assert n > 50_000
    assert not disagree, f"{len(disagree)} of {n} disagree, e.g. {disagree[:5]}"
    assert set(lenient_only) >= {"```python fence", "<TOOLCALL> tags", "list -> tuple", "syntax: set",
                                  "calls reversed"}  # the leniencies are exercised


def test_recorded_cases_are_not_all_alike():
    """The recorded decisions include accepts and rejects of most kinds (the file is not stale or blank)."""
    bits = "".join(b for _, b in json.loads(RECORDED.read_text())["entries"].values())
    assert 0.2 < bits.count("1") / len(bits) < 0.5


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """bfcl-eval's own decoder + checker, where bfcl-eval imports (it needs its heavy deps)."""
    with pytest.MonkeyPatch.context() as mp:
        # importing bfcl_eval.utils creates result/ score/ .file_locks/ under this root
        mp.setenv("BFCL_PROJECT_ROOT", str(tmp_path_factory.mktemp("bfcl_root")))
        pytest.importorskip("bfcl_eval.eval_checker.ast_eval.ast_checker",
                            reason="bfcl-eval's checker imports anthropic, openai, boto3, ... (not installed)")
        pytest.importorskip("bfcl_eval.model_handler.utils")
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
        try:
            from bfcl_official_decisions import official_decider
        finally:
            sys.path.pop(0)
        return official_decider(MODEL_NAME)


def test_agrees_with_official_checker_live(official):
    problems = TASK.load()
    recorded = json.loads(RECORDED.read_text())["entries"]
    disagree, stale, n = [], [], 0
    for p in problems:
        for text, bit in zip(cases(p), recorded[p.id][1], strict=False):
            n += 1
            off = official(p, text)
            if TASK.grade(p, text).passed != off:
                disagree.append((p.id, text, off))
            if (bit == "1") != off:
                stale.append((p.id, text, off))
    assert not disagree, f"{len(disagree)} of {n} disagree, e.g. {disagree[:5]}"
    assert not stale, f"recorded decisions differ from this bfcl-eval in {len(stale)} cases"
    for problem, text, expected, _lenient, _why in HAND:
        assert official(problem, text) is expected, text
    for problem, text, expected, _why in REMAINING:
        if expected is not None:
            assert official(problem, text) is expected, text
