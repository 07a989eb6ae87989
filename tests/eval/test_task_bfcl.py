"""BFCL: per-category counts; reference calls pass; wrong names, values and shapes fail."""

from __future__ import annotations

from collections import Counter

import pytest

from verispec.eval.tasks import get_task
from verispec.eval.tasks.bfcl import CATEGORIES, CallParseError, first_allowed_call, parse_calls

TASK = get_task("bfcl")
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


def test_shapes_and_leniencies():
    p = TASK.load(subset="simple", limit=1)[0]  # calculate_triangle_area(base=10, height=5)
    ok = [
        "[calculate_triangle_area(base=10, height=5)]",
        "calculate_triangle_area(base=10, height=5)",
        "```python\n[calculate_triangle_area(height=5, base=10, unit='units')]\n```",
        "<TOOLCALL>[calculate_triangle_area(base=10, height=5, unit='Units')]</TOOLCALL>",
        "[calculate_triangle_area(base=5*2, height=5)]",
    ]
    bad = [
        "[calculate_triangle_area(10, 5)]",  # positional
        "[calculate_triangle_area(base=10)]",  # missing required
        "[calculate_triangle_area(base=10, height=5, color='red')]",  # unknown param
        "[calculate_triangle_area(base=10.5, height=5)]",  # float for integer
        "[calculate_triangle_area(base='10', height=5)]",  # str for integer
        "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=10, height=5)]",
        "The area is 25.",
        "[__import__('os').system('echo hi')]",
    ]
    for text in ok:
        assert TASK.grade(p, text).passed, text
    for text in bad:
        assert not TASK.grade(p, text).passed, text


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
    assert parse_calls("[f(x=open)]") == [("f", {"x": "open"})]
