"""Reading the final number of a GSM / MGSM / CHAMP answer: headings, grouping, values below one, LaTeX fractions."""

from __future__ import annotations

from fractions import Fraction

import pytest

from verispec.eval.tasks import get_task
from verispec.eval.tasks._numeric import extract_answer

GSM = get_task("gsm")


def test_markdown_h4_headings_are_not_gsm8k_answer_lines():
    """"#### Step 2: ..." is a Markdown heading, not GSM8K's "#### 18"; the boxed answer decides."""
    text = ("#### Step 1: eggs left\n16 - 3 - 4 = 9\n#### Step 2: money\n9 * 2 = 18\n\n"
            "So the answer is \\boxed{18}.")
    assert extract_answer(text)[0] == 18
    assert extract_answer("#### 1. Eggs\n16-3-4=9\n#### 2. Money\n9*2 = \\boxed{18}")[0] == 18
    # GSM8K's own answer line still wins
    assert extract_answer("9*2=18\n#### 18")[0] == 18
    assert extract_answer("#### $1,234.50")[0] == Fraction("1234.5")
    problem = GSM.load(subset=["eng/0000"])[0]
    want = problem.reference["answer"]
    assert GSM.grade(problem, f"#### Step 1: think\n... \\boxed{{{want}}}").passed


@pytest.mark.parametrize("text", ["Il a donc 2 700.", "Il a donc 2 700, pas plus", "La réponse : 2\u202f700."])
def test_space_grouped_number_before_punctuation(text):
    assert extract_answer(text, decimal_comma=True)[0] == 2700


def test_space_grouped_millions_before_full_stop():
    assert extract_answer("total 1 000 000.")[0] == 1_000_000


@pytest.mark.parametrize(("text", "value"), [
    ("\\boxed{1,00,000}", 100_000),
    ("\\boxed{₹1,18,000}", 118_000),
    ("\\boxed{१,१८,०००}", 118_000),
    ("\\boxed{12,34,567}", 1_234_567),
    ("\\boxed{1,00,000.50}", Fraction("100000.5")),
])
def test_indian_digit_grouping(text, value):
    assert extract_answer(text)[0] == value


def test_indian_grouping_grades_hindi_answer():
    mgsm = get_task("mgsm")
    problem = next(p for p in mgsm.load(subset=["hin"]) if p.id == "hin/0034")
    assert mgsm.grade(problem, "उत्तर: \\boxed{₹1,18,000}").passed
    assert not mgsm.grade(problem, "उत्तर: \\boxed{₹1,18,001}").passed


@pytest.mark.parametrize(("text", "dc", "value"), [
    ("\\boxed{.5}", False, Fraction(1, 2)),
    ("The answer is .75", False, Fraction(3, 4)),
    ("\\boxed{-.5}", False, Fraction(-1, 2)),
    ("\\boxed{0,500}", False, Fraction(1, 2)),
    ("\\boxed{0.500}", True, Fraction(1, 2)),
])
def test_values_below_one(text, dc, value):
    assert extract_answer(text, decimal_comma=dc)[0] == value


def test_leading_dot_is_no_false_pass():
    """".5" was read as 5: a wrong answer passed where the reference is 5."""
    assert extract_answer("\\boxed{.5}")[0] != 5


@pytest.mark.parametrize(("text", "value"), [
    ("\\boxed{\\frac12}", Fraction(1, 2)),
    ("\\boxed{\\dfrac34}", Fraction(3, 4)),
    ("\\boxed{3\\frac{1}{2}}", Fraction(7, 2)),
    ("\\boxed{-3\\frac{1}{2}}", Fraction(-7, 2)),
    ("\\boxed{\\frac{1}{2}}", Fraction(1, 2)),
])
def test_latex_fraction_forms(text, value):
    assert extract_answer(text)[0] == value


def test_gsm_answer_3_5_as_mixed_number():
    problem = GSM.load(subset=["eng/0040"])[0]
    assert problem.reference["answer"] == "3.5"
    assert GSM.grade(problem, "\\boxed{3\\frac{1}{2}}").passed
    assert not GSM.grade(problem, "\\boxed{2}").passed


@pytest.mark.parametrize(("reference", "candidate", "passed"), [
    ("5050", "5,050", True),
    ("2001000", "2{,}001{,}000", True),
    ("376 and 625", "376,625", True),  # still a list of two values
    ("5050", "5,051", False),
])
def test_champ_thousands_separators(reference, candidate, passed):
    from verispec.eval.tasks.champ import match

    assert match(reference, candidate) is passed
