"""CHAMP: 270 competition-math problems with final answers (``champ-dataset==1.0.0``).

Data: ``champ_dataset/dataset_files/v0.json`` → ``problems`` (``_text`` statement, ``_answer``
final answer, ``category``: Combinatorics 40, Inequality 50, Number-Theory 80, Polynomial 50,
Sequence 50). The package is never imported (its ``__init__`` needs ``natsort``).

Prompt: solve step by step, final answer in ``\\boxed{}`` (Yes/No questions: Yes or No; answers
in terms of the problem's variables: a formula; several values: list them).

Grader (``match``): the CHAMP authors graded answers with GPT-4; this is a rule-based matcher,
not a judge. The reference and the candidate (last ``\\boxed{}``, else text after "answer is" /
"answer:", else the last line; a candidate with thousands separators such as ``5,050`` is also
read as one number) are parsed by the same ``parse_answer`` into alternatives
("X, or equivalently Y" gives two; "or approximately" ones are dropped) of one of these kinds:

* ``bool``   Yes/No (first word);
* ``none``   "No integer solutions", "does not exist", "not possible" ... ; a candidate matches
             with any such negative phrase ("none", "no solutions", ``\\emptyset``) or a bare "No";
* ``expr``   a number or formula (``2^(n-1)``, ``\\frac{n(n-3)}{2}``, ``\\sqrt{3}/3``): equal
             exactly when both values are exact, else within 1e-6; formulas agree at 7 small
             integer points of their variables (see ``_mathexpr``; a variable the reference
             lacks fails); "N values" / "X is the only possible value" / "the limit ... is X" /
             "at most N" / "exactly one" reduce to X;
* ``set``    several values ("376 and 625", "x=±1, ±2, ±1/2"): same values, any order;
* ``assign`` solutions as variable assignments ("x=6, y=5 and x=9, y=11"); a candidate may
             give tuples ``(6, 5)`` in the reference's variable order;
* ``text``   anything else: every content word of the reference appears in the candidate,
             with the same negation (so "not periodic" ≠ "periodic").

Limits, honestly: no symbolic algebra, so equivalence is numerical and a factorization question
accepts any equal polynomial (expanded or not); text answers (13 of 270, e.g. "x(n)<y(n-1) for
all n≥3", "Monotonically increasing") are matched by words and can be fooled either way;
intervals, sums with "..." and descriptive answers are not understood as math; a candidate that
answers a counting question with words ("none") only matches where the reference says so.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from verispec.eval.tasks import _mathexpr as mx
from verispec.eval.tasks._numeric import last_boxed
from verispec.eval.tasks.base import Grade, Problem, as_list, package_dir, take

PROMPT = (
    "Solve the following math problem. Reason step by step, then give the final answer in "
    "\\boxed{{}}: for a yes/no question write Yes or No; for an answer in terms of the "
    "problem's variables write the formula; for several values list them all.\n\n{problem}"
)

_ALT_SPLIT = re.compile(r",?\s+or (?:equivalently|an equivalent form such as)\s+", re.I)
_APPROX = re.compile(r",?\s+or approximately\s+.*$", re.I)
_PREFIXES = re.compile(
    r"^(?:the limit exists and is equal to|the only possible value for the limit is|"
    r"the function is periodic, with a period of|at most|at least|exactly|there are|"
    r"the answer is|answer:)\s+", re.I)
_SUFFIXES = re.compile(
    r"\s+(?:is the only possible value|values?|pairs?|roots?|inequalities|numbers?|times|"
    r"sequences?|integer-valued (?:zeros|roots)|integer (?:zeros|roots)|zeros)$",
    re.I)
_NONE = re.compile(
    r"\b(?:no (?:\w+ ){0,3}(?:solutions?|values?|such|sequence)|none|not possible|impossible|"
    r"does not exist|doesn't exist|do not exist|there (?:is|are) no)\b|\\emptyset|∅|\\varnothing",
    re.I)
_WORDS = {"one": "1", "two": "2", "three": "3", "zero": "0", "none": "0"}
_STOP = {"the", "a", "an", "is", "are", "it", "and", "of", "with", "sequence", "to", "be"}


@dataclass(frozen=True)
class Answer:
    """One parsed alternative: ``kind`` and its ``value`` (tree, list of trees, list of dicts,
    bool, or normalized text)."""

    kind: str
    value: object
    text: str


def _strip_parenthetical(s: str) -> str:
    """Drop explanatory parentheses like "(i.e., all values)" (balanced)."""
    out = s
    while True:
        m = re.search(r"\s*\((?:i\.e\.|none of|no such|no |all of)", out, re.I)
        if not m:
            return out.strip()
        depth, j = 0, m.start()
        for j in range(out.index("(", m.start()), len(out)):
            depth += {"(": 1, ")": -1}.get(out[j], 0)
            if depth == 0:
                break
        out = out[: m.start()] + out[j + 1 :]


def _split_top(s: str, seps: str) -> list[str]:
    """Split ``s`` on the regex ``seps`` outside parentheses/brackets/braces."""
    parts, depth, last = [], 0, 0
    pat = re.compile(seps)
    i = 0
    while i < len(s):
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            m = pat.match(s, i)
            if m and m.end() > i:
                parts.append(s[last:i])
                last = i = m.end()
                continue
        i += 1
    parts.append(s[last:])
    return [p.strip() for p in parts if p.strip()]


def _expand_pm(s: str) -> list[str]:
    """``a±b`` → ``[a+b, a-b]`` (every ± expanded)."""
    if "±" not in s:
        return [s]
    i = s.index("±")
    return _expand_pm(s[:i] + "+" + s[i + 1 :]) + _expand_pm(s[:i] + "-" + s[i + 1 :])


def _expr(s: str) -> mx.Tree | None:
    s = s.strip().rstrip(".")
    s = _WORDS.get(s.lower(), s)
    try:
        return mx.parse(s)
    except mx.ParseError:
        return None


def _clean(s: str) -> str:
    s = mx.delatex(s) if "\\" in s else s
    s = _strip_parenthetical(s.strip().strip("$").strip())
    s = _PREFIXES.sub("", s)
    s = _SUFFIXES.sub("", s)
    return s.strip().rstrip(".").strip()


def _assignments(s: str) -> list[dict[str, mx.Tree]] | None:
    """"x=6, y=5 and x=9, y=11" / "(x=8, y=2), (x=2, y=8)" / "x=y=0" → list of solutions."""
    sols = []
    for chunk in _split_top(s, r"\s+and\s+|\s+or\s+|;"):
        chunk = chunk.strip()
        groups = re.findall(r"\(([^()]*=[^()]*)\)", chunk) if chunk.startswith("(") else [chunk]
        for g in groups:
            sol: dict[str, mx.Tree] = {}
            for item in _split_top(g, r","):
                names, _, rhs = item.rpartition("=")
                tree = _expr(rhs)
                if tree is None or not names:
                    return None
                for name in names.split("="):
                    if not re.fullmatch(r"\s*[a-z]\s*", name):
                        return None
                    sol[name.strip()] = tree
            sols.append(sol)
    return sols or None


def _text_key(s: str) -> str:
    """Normalized text for word answers: no stopwords, spaces, brackets, ``_`` or ``$``."""
    s = mx.delatex(s).lower()
    words = [w for w in re.split(r"\s+", s) if w not in _STOP]
    return re.sub(r"[\s(){}\[\]_$.,;:!]", "", "".join(words)).replace("...", "")


def parse_answer(text: str) -> list[Answer]:
    """Alternatives of an answer text (reference or candidate); never empty."""
    text = _APPROX.sub("", text.strip())
    text = re.sub(r"\\left\\\{|\\right\\\}|\\\{|\\\}", " ", text)  # set braces
    out = []
    for alt in _ALT_SPLIT.split(text):
        raw = _strip_parenthetical(mx.delatex(alt) if "\\" in alt else alt).strip().strip("$")
        low = raw.lower()
        first = re.split(r"[\s,.;:!]+", low.strip(), maxsplit=1)[0] if low.strip() else ""
        if first in ("yes", "no", "true", "false") and (first != "no" or not _NONE.search(low)):
            out.append(Answer("bool", first in ("yes", "true"), alt))
            continue
        if _NONE.search(low):
            out.append(Answer("none", None, alt))
            continue
        if re.search(r"infinite|infinitely many|∞", low):
            out.append(Answer("infinite", None, alt))
            continue
        s = _clean(alt)
        iv = re.fullmatch(r"([\[(])([^,\[\]()]+),([^,\[\]()]+)([\])])", s.replace(" ", ""))
        if iv and _expr(iv.group(2)) is not None and _expr(iv.group(3)) is not None:
            out.append(Answer("interval", (iv.group(1) + iv.group(4), _expr(iv.group(2)),
                                           _expr(iv.group(3))), alt))
            continue
        if "=" in s and re.search(r"[a-z]\s*=", s) and not re.match(r"^f\(x\)\s*=", s):
            sols = _assignments(s)
            if sols and len({frozenset(d) for d in sols}) == 1 and len(sols[0]) > 1:
                out.append(Answer("assign", sols, alt))
                continue
        items = _split_top(s, r",\s*|\s+and\s+|\s+or\s+")
        if len(items) > 1 or "±" in s:
            vals = []
            for it in items:
                it = re.sub(r"^(?:[a-z]|f\([a-z]\))\s*=\s*", "", it.strip())
                vals += [_expr(x) for x in _expand_pm(it)]
            if vals and all(v is not None for v in vals):
                out.append(Answer("set", vals, alt))
                continue
        tree = _expr(re.sub(r"^(?:[a-z]|f\([a-z]\))\s*=\s*", "", s))
        if tree is not None:
            out.append(Answer("expr", tree, alt))
            continue
        out.append(Answer("text", _text_key(raw), alt))
    return out


def _same_set(ref: list, cand: list) -> bool:
    if len(ref) != len(cand):
        return False
    left = list(cand)
    for r in ref:
        hit = next((c for c in left if mx.equivalent(r, c)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


def _tuples(cand_text: str, names: list[str]) -> list[dict[str, mx.Tree]] | None:
    """Candidate solutions given as tuples ``(6, 5), (2, 8)`` in the reference's var order."""
    found = re.findall(r"\(([^()]*)\)", cand_text)
    sols = []
    for f in found:
        vals = [_expr(v) for v in f.split(",")]
        if any(v is not None and mx.variables(v) for v in vals):
            continue  # "(x, y) = (6, 5)": skip the names tuple
        if len(vals) != len(names) or any(v is None for v in vals):
            return None
        sols.append(dict(zip(names, vals, strict=True)))
    return sols or None


def _match_one(ref: Answer, cand: Answer, cand_text: str) -> bool:
    kind = ref.kind
    if kind == "bool":
        return (cand.kind == "bool" and cand.value == ref.value) or (
            ref.value is False and cand.kind == "none")
    if kind == "none":
        return cand.kind == "none" or (cand.kind == "bool" and cand.value is False)
    if kind == "infinite":
        return cand.kind == "infinite"
    if kind == "expr":
        return cand.kind == "expr" and mx.equivalent(ref.value, cand.value)
    if kind == "interval":
        return cand.kind == "interval" and cand.value[0] == ref.value[0] and all(
            mx.equivalent(r, c) for r, c in zip(ref.value[1:], cand.value[1:], strict=True))
    if kind == "set":
        return cand.kind == "set" and _same_set(ref.value, cand.value)
    if kind == "assign":
        names = list(ref.value[0])
        sols = cand.value if cand.kind == "assign" else _tuples(mx.delatex(cand_text), names)
        if not sols or len(sols) != len(ref.value):
            return False
        left = list(sols)
        for r in ref.value:
            hit = next((c for c in left if set(c) == set(r)
                        and all(mx.equivalent(r[k], c[k]) for k in r)), None)
            if hit is None:
                return False
            left.remove(hit)
        return True
    key = _text_key(cand_text)
    negated = bool(re.search(r"\b(?:not|no|never|cannot)\b|n't", cand_text.lower()))
    return bool(ref.value) and ref.value in key and negated == bool(
        re.search(r"\b(?:not|no|never|cannot)\b|n't", ref.text.lower()))


def candidate_text(completion: str) -> str:
    """The final-answer span of a completion."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    m = list(re.finditer(r"(?:final answer|answer)\s*(?:is|:)\s*", completion, re.I))
    if m:
        return completion[m[-1].end() :].strip().split("\n")[0].strip()
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


# digits grouped by thousands ("5,050", "2{,}001{,}000"): also read as one number
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:(?:,|\{,\})\d{3})+(?!\d)")


def match(reference: str, candidate: str) -> bool:
    """True iff some alternative of ``candidate`` matches some alternative of ``reference``.

    A candidate with thousands separators is read both ways ("376,625" may list two values)."""
    refs = parse_answer(reference)
    texts = [candidate]
    ungrouped = _THOUSANDS.sub(lambda m: re.sub(r"\{,\}|,", "", m.group(0)), candidate)
    if ungrouped != candidate:
        texts.append(ungrouped)
    return any(_match_one(r, c, text) for text in texts for r in refs for c in parse_answer(text))


@functools.lru_cache(maxsize=1)
def _rows() -> dict[str, dict]:
    """The ``problems`` table of v0.json (72 MB of JSON; read once per process)."""
    path = package_dir("champ_dataset") / "dataset_files" / "v0.json"
    with path.open(encoding="utf-8") as f:
        return json.load(f)["problems"]


class ChampTask:
    """CHAMP as a :class:`~verispec.eval.tasks.base.Task`."""

    name = "champ"

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]:
        """All 270 problems in file order; ``subset`` selects categories (e.g. "Polynomial")."""
        rows = _rows()
        wanted = as_list(subset)
        problems = [
            Problem(task=self.name, id=pid,
                    messages=[{"role": "user", "content": PROMPT.format(problem=r["_text"])}],
                    reference={"answer": r["_answer"]}, meta={"category": r["category"]})
            for pid, r in rows.items() if wanted is None or r["category"] in wanted
        ]
        return take(problems, limit)

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        """See :func:`match`."""
        cand = candidate_text(completion_text)
        ok = bool(cand) and match(problem.reference["answer"], cand)
        kinds = "/".join(a.kind for a in parse_answer(problem.reference["answer"]))
        return Grade(ok, float(ok), f"{kinds}: expected {problem.reference['answer']!r}", cand)
