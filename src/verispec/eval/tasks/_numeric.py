"""Final-number extraction for math word problems (GSM, MGSM), exact as a ``Fraction``.

Where the answer is looked for, first hit wins:

1. on the last ``####`` answer line (GSM8K reference style: ``#### 18``; a line with letters on it,
   such as the Markdown heading ``#### Step 2: ...``, is no answer line);
2. inside the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces; LaTeX ``\\frac``,
   ``\\dfrac`` (also ``\\frac12``; ``3\\frac{1}{2}`` is the mixed number 7/2), ``\\text{}``, ``\\$``,
   ``{,}``, ``\\,`` are undone first);
3. after the last "answer is" / "answer:" / "final answer" phrase (English only);
4. the last number in the text.

Numbers: optional sign (``-`` or U+2212), currency signs and ``%`` dropped, any Unicode decimal
digits (Devanagari, Arabic-Indic ...) mapped to ASCII, ``a/b`` fractions, ``.5`` = 0.5, thousands
separators (``,`` ``.`` ``'``, no-break spaces, and a plain space between digit groups of 3 as in
``2 700``; Indian lakh grouping ``1,00,000`` too).
Separator rules: with both ``,`` and ``.`` the later one is the decimal mark; a separator that
repeats is a thousands separator (groups of 3 checked); a single separator followed by 1-2 or 4+
digits is a decimal mark; a single separator followed by exactly 3 digits is ambiguous and is read
by the language's convention (``decimal_comma``: ``1.500`` = 1500 and ``1,500`` = 1.5; otherwise
the reverse), except after a zero (``0,500`` and ``0.500`` are 0.5). Trailing ``.0`` is harmless
(values compare as exact fractions).
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

_NUM = re.compile(
    r"(?:(?<![\w)])[-\u2212])?[$€£¥₹]?\s?"
    # a space-grouped number may end a sentence ("2 700."): only a separator+digit continues it
    r"(?:\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:[.,]\d+)?(?!\d|[.,]\d)"
    r"|\d(?:[\d,.'\u00a0\u202f\u066b\u066c]*\d)?"
    r"|(?<![\w.])\.\d+)"  # ".5" is 0.5, not 5
    r"(?:\s*/\s*\d+(?:\.\d+)?)?"
)
# "#### 18" (GSM8K's answer line): a line of "####" and a number; a Markdown heading such as
# "#### Step 2: ..." has letters on it and is no answer line
_HASH = re.compile(r"####((?:(?![^\W\d_])[^\n#])*\d(?:(?![^\W\d_])[^\n#])*)$", re.M)
_PHRASE = re.compile(r"\banswer\s*(?:is\b|:|=)\s*[:=]?", re.I)


def to_ascii_digits(text: str) -> str:
    """Map every Unicode decimal digit to its ASCII digit (and Arabic separators to , and .)."""
    out = []
    for ch in text:
        d = unicodedata.decimal(ch, None) if not ch.isascii() else None
        if d is not None:
            out.append(str(d))
        elif ch == "\u066b":
            out.append(".")
        elif ch == "\u066c":
            out.append(",")
        else:
            out.append(ch)
    return "".join(out)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces), if any."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0 or not re.fullmatch(r"\\(?:boxed|fbox)\s*", text[start:i]):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return text[i + 1 :]


# the two arguments of \frac: braced, or a single digit as in \frac12
_FRAC_ARGS = r"(\{([^{}]*)\}|(\d))\s*(\{([^{}]*)\}|(\d))"


def _arg(m: re.Match[str], i: int) -> str:
    """The ``\\frac`` argument whose braced form is group ``i`` (its single-digit form is ``i + 1``)."""
    return m.group(i) if m.group(i) is not None else m.group(i + 1)


def _mixed(m: re.Match[str]) -> str:
    """``3\\frac{1}{2}`` as the single fraction ``7/2`` when all parts are whole numbers."""
    whole, num, den = m.group(1), _arg(m, 3), _arg(m, 6)
    if not (num.strip().isdigit() and den.strip().isdigit()) or int(den) == 0:
        return m.group(0)
    return f"{int(whole) * int(den) + int(num)}/{int(den)}"


def unlatex(s: str) -> str:
    """Undo the LaTeX that commonly wraps a boxed number."""
    # a whole number right before a fraction is a mixed number: 3\frac{1}{2} = 7/2
    s = re.sub(r"(?<![\d.,])(\d+)[ \t]*\\[dt]?frac\s*" + _FRAC_ARGS, _mixed, s)
    s = re.sub(r"\\[dt]?frac\s*" + _FRAC_ARGS,
               lambda m: f"({_arg(m, 2)})/({_arg(m, 5)})", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("{,}", ",").replace("\\,", "").replace("\\!", "").replace("\\ ", " ")
    s = s.replace("\\$", "$").replace("\\%", "%").replace("\\left", "").replace("\\right", "")
    return s.replace("$", " ").replace("{", "").replace("}", "")


def _decimal_str(tok: str, decimal_comma: bool) -> str | None:
    """Plain decimal string for a digits-and-separators token, or None if malformed."""
    tok = re.sub(r"[\u00a0\u202f' ]", "", tok)
    seps = [c for c in tok if c in ",."]
    if not seps:
        return tok
    if "," in seps and "." in seps:
        dec = "," if tok.rfind(",") > tok.rfind(".") else "."
        grp = "." if dec == "," else ","
        whole, frac = tok.rsplit(dec, 1)
        if dec in whole:
            return None
        parts = whole.split(grp)
    else:
        sep = grp = seps[0]
        parts = tok.split(sep)
        if len(parts) > 2:  # repeated separator: thousands
            frac = ""
        else:
            after = parts[1]
            # "0,500" / "0.500" can only be a decimal: nobody groups thousands after a zero
            is_decimal = (len(after) != 3 or not parts[0].strip("0")
                          or (sep == "," if decimal_comma else sep == "."))
            if is_decimal:
                return parts[0] + "." + after
            frac = ""
    if parts[1:] and not (_western(parts) or (grp == "," and _indian(parts))):
        return None
    return "".join(parts) + ("." + frac if frac else "")


def _western(groups: list[str]) -> bool:
    """Thousands grouping: 1,234,567."""
    return 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


def _indian(groups: list[str]) -> bool:
    """Lakh/crore grouping (Hindi, Marathi, Punjabi, Urdu ...): 1,00,000 and 12,34,567."""
    return (len(groups) > 2 and 1 <= len(groups[0]) <= 2 and len(groups[-1]) == 3
            and all(len(g) == 2 for g in groups[1:-1]))


def parse_number(s: str, decimal_comma: bool = False) -> Fraction | None:
    """Parse one number token (``"-1,234.5"``, ``"$12"``, ``"3/4"``, ``"१२"``) exactly."""
    s = to_ascii_digits(unlatex(s)).strip().rstrip(".").replace("\u2212", "-")
    s = re.sub(r"[$€£¥₹%]", "", s).strip()
    neg = s.startswith("-")
    s = s.lstrip("-+ ").strip("()")
    if s.startswith("."):  # ".5"
        s = "0" + s
    if "/" in s:
        num, _, den = s.partition("/")
        a = parse_number(num, decimal_comma)
        b = parse_number(den, decimal_comma)
        if a is None or b is None or b == 0:
            return None
        val = a / b
    else:
        if not re.fullmatch(r"\d[\d,.'\u00a0\u202f ]*", s) or not s[-1].isdigit():
            return None
        dec = _decimal_str(s, decimal_comma)
        if dec is None:
            return None
        val = Fraction(dec)
    return -val if neg else val


def numbers_in(text: str, decimal_comma: bool = False) -> list[tuple[Fraction, str]]:
    """Every parseable number in ``text`` with its source token, in order."""
    text = to_ascii_digits(text)
    found = []
    for m in _NUM.finditer(text):
        tok = m.group(0).strip()
        val = parse_number(tok, decimal_comma)
        if val is None:  # e.g. "1,2,3": fall back to the plain digit runs
            for part in re.findall(r"\d+(?:\.\d+)?", tok):
                found.append((Fraction(part), part))
        else:
            found.append((val, tok))
    return found


def extract_answer(text: str, decimal_comma: bool = False) -> tuple[Fraction | None, str | None]:
    """The final numeric answer of a completion and the text it was read from."""
    for m in reversed(list(_HASH.finditer(text))):
        nums = numbers_in(m.group(1), decimal_comma)
        if nums:
            return nums[0]
    boxed = last_boxed(text)
    if boxed is not None:
        inner = unlatex(boxed)
        whole = parse_number(inner.replace(" ", ""), decimal_comma)
        if whole is not None:
            return whole, boxed
        nums = numbers_in(inner, decimal_comma)
        if nums:
            return nums[-1][0], boxed
    phrases = list(_PHRASE.finditer(text))
    if phrases:
        nums = numbers_in(text[phrases[-1].end() : phrases[-1].end() + 80], decimal_comma)
        if nums:
            return nums[0]
    nums = numbers_in(unlatex(text), decimal_comma)
    return nums[-1] if nums else (None, None)


def fmt(value: Fraction | None) -> str:
    """Compact display of an exact value (``12``, ``3.5``, ``-57/2``)."""
    if value is None:
        return "None"
    if value.denominator == 1:
        return str(value.numerator)
    f = float(value)
    return repr(f) if Fraction(repr(f)) == value else f"{value.numerator}/{value.denominator}"
