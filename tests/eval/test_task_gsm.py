"""GSM (English) and MGSM: counts, round-robin balance, and the numeric grader."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from verispec.eval.tasks import get_task
from verispec.eval.tasks._numeric import extract_answer, parse_number
from verispec.eval.tasks.mgsm import LANGUAGES

GSM = get_task("gsm")
MGSM = get_task("mgsm")


def test_gsm_count_and_prompt():
    problems = GSM.load()
    assert len(problems) == 100
    p = problems[0]
    assert p.id == "eng/0000" and p.meta["language"] == "eng"
    assert "\\boxed{}" in p.messages[0]["content"] and "shark" in p.messages[0]["content"]
    assert len(GSM.load(limit=5)) == 5


def test_gsm_reference_solutions_extract_to_their_answer():
    for p in GSM.load():
        assert "####" in p.reference["solution"]
        grade = GSM.grade(p, p.reference["solution"])
        assert grade.passed, (p.id, grade)


def test_gsm_without_hash_marks_most_last_numbers_are_the_answer():
    """The fallback (last number) is right on most worked solutions, not on all."""
    problems = GSM.load()
    hits = sum(GSM.grade(p, p.reference["solution"].rsplit("####", 1)[0]).passed for p in problems)
    assert 80 <= hits < 100


def test_gsm_rejects_wrong_answers():
    for p in GSM.load(limit=30):
        want = parse_number(p.reference["answer"])
        assert not GSM.grade(p, f"The answer is \\boxed{{{want + 1}}}.").passed
        assert not GSM.grade(p, "I don't know.").passed


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("so the answer is 1,234.", 1234),
        ("\\boxed{\\$1,234.50}", Fraction("1234.5")),
        ("#### 3.5", Fraction("3.5")),
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("total 12.0 dollars", 12),
        ("The answer is -5", -5),
        ("x = 12 - 3 = 9", 9),
        ("\\boxed{10\\%}", 10),
        ("\\boxed{50{,}000}", 50000),
        ("answer: $18", 18),
        ("\\boxed{\\text{42 apples}}", 42),
        ("I get 7 first, but \\boxed{8} at the end, then 9 more words 10", 8),
        ("Final answer: 1 000", 1000),
        ("it's 2/3", Fraction(2, 3)),
    ],
)
def test_extractor(text, value):
    assert extract_answer(text)[0] == value


def test_extractor_decimal_comma_and_scripts():
    assert extract_answer("Ergebnis: 2.772.900 EUR", decimal_comma=True)[0] == 2772900
    assert extract_answer("\\boxed{82,3}", decimal_comma=True)[0] == Fraction("82.3")
    assert extract_answer("1.500", decimal_comma=True)[0] == 1500
    assert extract_answer("1.500")[0] == Fraction("1.5")
    assert extract_answer("#### १२")[0] == 12
    assert extract_answer("\\boxed{٤٢}")[0] == 42
    assert extract_answer("no numbers here") == (None, None)


def test_mgsm_languages_and_balance():
    assert "eng" not in LANGUAGES and len(LANGUAGES) == 17
    everything = MGSM.load()
    assert Counter(p.meta["language"] for p in everything) == {lang: 100 for lang in LANGUAGES}
    first = MGSM.load(limit=34)
    assert Counter(p.meta["language"] for p in first) == {lang: 2 for lang in LANGUAGES}
    assert [p.meta["language"] for p in first[:3]] == list(LANGUAGES[:3])
    deu = MGSM.load(limit=2, subset=["deu"])
    assert [p.id for p in deu] == ["deu/0000", "deu/0001"]
    assert deu[0].messages[0]["content"].startswith("Löse")


def test_mgsm_reference_solutions_pass_and_wrong_fail():
    for p in MGSM.load():
        assert MGSM.grade(p, p.reference["solution"]).passed, p.id
        assert MGSM.grade(p, f"... \\boxed{{{p.reference['answer']}}}").passed, p.id
        want = parse_number(p.reference["answer"], p.meta["decimal_comma"])
        assert not MGSM.grade(p, f"\\boxed{{{want * 2 + 1}}}").passed, p.id
