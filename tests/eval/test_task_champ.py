"""CHAMP: 270 problems; every reference answer matches itself, perturbed answers do not."""

from __future__ import annotations

from collections import Counter

import pytest

from verispec.eval.tasks import _mathexpr as mx
from verispec.eval.tasks import get_task
from verispec.eval.tasks.champ import _clean, match, parse_answer

TASK = get_task("champ")
PROBLEMS = TASK.load()
BY_ID = {p.id: p for p in PROBLEMS}


def test_count_and_categories():
    assert len(PROBLEMS) == 270
    assert Counter(p.meta["category"] for p in PROBLEMS) == {
        "Number-Theory": 80, "Inequality": 50, "Polynomial": 50, "Sequence": 50, "Combinatorics": 40}
    assert len(TASK.load(subset="Polynomial")) == 50
    assert "\\boxed{}" in PROBLEMS[0].messages[0]["content"]


def test_reference_answers_match_themselves():
    for p in PROBLEMS:
        ans = p.reference["answer"]
        assert TASK.grade(p, ans).passed, p.id  # unboxed: last line
        assert TASK.grade(p, f"Reasoning...\nThe final answer is \\boxed{{{ans}}}").passed, p.id


def _perturb(answer: str) -> str:
    """A wrong answer in the same form as the reference's first alternative."""
    a = parse_answer(answer)[0]
    if a.kind == "bool":
        return "No" if a.value else "Yes"
    if a.kind in ("none", "infinite"):
        return "7"
    if a.kind == "expr":
        return f"({_clean(a.text)}) + 1" if mx.variables(a.value) else "123457"
    if a.kind == "set":
        return ", ".join(["1000003"] + ["7"] * (len(a.value) - 1))
    if a.kind == "assign":
        names = list(a.value[0])
        return " and ".join(", ".join(f"{n}=1000{i}" for i, n in enumerate(names)) for _ in a.value)
    if a.kind == "interval":
        return "[0, 5]"
    return "Something else entirely"


def test_perturbed_answers_fail():
    for p in PROBLEMS:
        wrong = _perturb(p.reference["answer"])
        grade = TASK.grade(p, f"\\boxed{{{wrong}}}")
        assert not grade.passed, (p.id, wrong)
        first = parse_answer(p.reference["answer"])[0]
        if first.kind == "expr":  # the unperturbed cleaned form is accepted
            assert TASK.grade(p, f"\\boxed{{{_clean(first.text)}}}").passed, p.id


@pytest.mark.parametrize(
    ("pid", "completion", "ok"),
    [
        ("P_Combinatorics_2", "\\boxed{\\binom{10}{5}}", True),
        ("P_Combinatorics_2", "\\boxed{251}", False),
        ("P_Combinatorics_11", "so \\boxed{\\frac{n(n-3)}{2}}", True),
        ("P_Combinatorics_11", "\\boxed{\\frac{n(n-2)}{2}}", False),
        ("P_Combinatorics_11", "\\boxed{\\frac{k(k-3)}{2}}", False),
        ("P_Combinatorics_17", "\\boxed{\\text{No}}", True),
        ("P_Combinatorics_6", "\\boxed{2^{n-1}}", True),
        ("P_Combinatorics_1", "The answer is 239.", True),
        ("P_Number-Theory_4", "\\boxed{(x, y) = (6, 5)}", True),
        ("P_Number-Theory_4", "\\boxed{x = 6, y = 5}", True),
        ("P_Number-Theory_4", "\\boxed{(5, 6)}", False),
        ("P_Number-Theory_3", "\\boxed{\\{376, 625\\}}", True),
        ("P_Number-Theory_3", "\\boxed{625 \\text{ and } 376}", True),
        ("P_Number-Theory_3", "\\boxed{376}", False),
        ("P_Number-Theory_39", "\\boxed{(0, 2), (9, 11)}", True),
        ("P_Number-Theory_39", "\\boxed{(0, 2)}", False),
        ("P_Polynomial_22", "\\boxed{x = \\pm 1}", True),
        ("P_Polynomial_22", "\\boxed{1}", False),
        ("P_Inequality_1", "\\boxed{[-1, 1]}", True),
        ("P_Inequality_1", "\\boxed{(-1, 1)}", False),
        ("P_Number-Theory_7", "\\boxed{\\text{There are no integer solutions}}", True),
        ("P_Number-Theory_7", "\\boxed{0}", False),
        ("P_Sequence_17", "\\boxed{\\text{The sequence is not periodic}}", True),
        ("P_Sequence_17", "\\boxed{\\text{periodic}}", False),
        ("P_Inequality_9", "\\boxed{x(n) < y(n-1) \\text{ for all } n \\geq 3}", True),
        ("P_Inequality_9", "\\boxed{x(n) > y(n-1) \\text{ for all } n \\geq 3}", False),
        ("P_Inequality_18", "\\boxed{\\frac{1}{\\sqrt{3}}}", True),
        ("P_Inequality_18", "\\boxed{0.5773503}", True),
        ("P_Inequality_18", "\\boxed{0.577}", False),
        ("P_Sequence_34", "\\boxed{2^{997}}", True),
        ("P_Sequence_34", "\\boxed{2^{998}}", False),
        ("P_Number-Theory_51", "\\boxed{1176470588235295}", False),
        ("P_Number-Theory_59", "\\boxed{\\infty}", True),
        ("P_Polynomial_14", "\\boxed{(x^2-x+1)(x^2+x+1)}", True),
        ("P_Polynomial_14", "\\boxed{x^4+x^2+1}", True),  # documented limit: no form check
        ("P_Sequence_7", "\\boxed{3}", True),
        ("P_Sequence_44", "\\boxed{1}", True),
    ],
)
def test_matcher_examples(pid, completion, ok):
    assert TASK.grade(BY_ID[pid], completion).passed is ok


def test_expression_reader():
    assert mx.equivalent(mx.parse("C(n, 4)"), mx.parse("n(n-1)(n-2)(n-3)/4!"))
    assert mx.equivalent(mx.parse("\\frac{\\sqrt{3}}{3}"), mx.parse("1/sqrt(3)"))
    assert not mx.equivalent(mx.parse("2^n"), mx.parse("2^n + 1"))
    assert not match("n", "Always greater than 20")
    with pytest.raises(mx.ParseError):
        mx.parse("monotonically increasing")
    assert mx.evaluate(mx.parse("10^4000")) > 0
    with pytest.raises(ValueError):
        mx.evaluate(mx.parse("2^(10^9)"))
