"""A tiny, safe math-expression reader and evaluator (no ``eval``, no sympy) for answer matching.

``parse(text)`` reads plain or LaTeX-ish math: numbers, single-letter variables (``xy`` is ``x*y``;
longer letter runs other than ``abc``/``xyz``-style ones are words, not math), ``+ - * / ^ **``,
unary minus, postfix ``!``, implicit multiplication (``2n``, ``n(n+1)``), parentheses/brackets, and
the functions ``sqrt floor ceil abs C binom exp ln log`` plus ``pi``. ``evaluate(tree, env)``
computes exactly with ``Fraction`` where it can (``sqrt`` of perfect squares, integer powers) and
falls back to float otherwise. ``equivalent(a, b)`` compares two expressions numerically: exactly
when both values are exact, else within 1e-6; with free variables, at several small integer points
(a randomized-identity test, not a proof). Work is bounded: exponents up to 10000, factorials up to
2000, integers up to 10**5000.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

Value = Fraction | float
Tree = tuple

FUNCS1 = {"sqrt", "floor", "ceil", "abs", "exp", "ln", "log"}
FUNCS2 = {"C", "binom"}
CONSTS = {"pi"}
_LATEX = [
    (r"\\left|\\right|\\displaystyle|\\!|\\,|\\;|\\:|\\quad|\$", ""),
    (r"\\(?:cdot|times)\b", "*"),
    (r"\\div", "/"),
    (r"\\pi\b", "pi"),
    (r"\\lfloor", "floor("), (r"\\rfloor", ")"), (r"\\lceil", "ceil("), (r"\\rceil", ")"),
    (r"\\(?:text|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}", r"\1"),
    (r"\\pm", "±"),
    (r"\\(?:geqslant|geq|ge)\b", ">="), (r"\\(?:leqslant|leq|le)\b", "<="), (r"\\(?:neq|ne)\b", "!="),
    (r"\\(?:cdots|ldots|dots)", "..."), (r"\\infty", "∞"),
]
_SUBS = {"−": "-", "–": "-", "×": "*", "·": "*", "÷": "/", "√": "sqrt", "**": "^", "π": "pi",
         "≥": ">=", "≤": "<=", "…": "..."}


class ParseError(ValueError):
    """The text is not an expression this reader understands."""


def _brace_arg(s: str, i: int) -> tuple[str, int]:
    """The ``{...}`` group starting at ``s[i]`` (balanced) and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s) or s[i] != "{":
        if i < len(s):
            return s[i], i + 1  # \frac12 style single-token argument
        raise ParseError("missing argument")
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    raise ParseError("unbalanced braces")


def delatex(s: str) -> str:
    """Rewrite common LaTeX (``\\frac``, ``\\sqrt``, ``\\binom``, ``^{}``) as plain math."""
    for pat, rep in _LATEX:
        s = re.sub(pat, rep, s)
    for _ in range(50):
        m = re.search(r"\\(d|t)?frac|\\binom|\\sqrt", s)
        if not m:
            break
        name = m.group(0)
        i = m.end()
        if name == "\\sqrt":
            root = None
            if i < len(s) and s[i] == "[":
                k = s.index("]", i)
                root, i = s[i + 1 : k], k + 1
            a, i = _brace_arg(s, i)
            rep = f"sqrt({a})" if root is None else f"(({a})^(1/({root})))"
        else:
            a, i = _brace_arg(s, i)
            b, i = _brace_arg(s, i)
            rep = f"(({a})/({b}))" if "frac" in name else f"C({a},{b})"
        s = s[: m.start()] + rep + s[i:]
    s = s.replace("{", "(").replace("}", ")").replace("\\", "")
    for a, b in _SUBS.items():
        s = s.replace(a, b)
    return s


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|([A-Za-z]+)|(\^|[-+*/!(),\[\]]))")


def _tokens(s: str) -> list[str]:
    out: list[str] = []
    pos = 0
    s = s.strip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            raise ParseError(f"unexpected {s[pos:pos + 10]!r}")
        num, word, op = m.groups()
        if word is not None:
            if word in FUNCS1 | FUNCS2 | CONSTS:
                out.append(word)
            elif len(word) <= 2 or (len(word) == 3 and set(word) <= set("abcxyz")):
                out.extend(word)  # xy -> x y (implicit product)
            else:
                raise ParseError(f"word {word!r} is not math")
        else:
            out.append(num or op)
        pos = m.end()
    return out


class _Parser:
    def __init__(self, toks: list[str]) -> None:
        self.t, self.i = toks, 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ParseError(f"expected {want!r}, got {tok!r}")
        self.i += 1
        return tok

    def expr(self) -> Tree:
        node = self.term()
        while self.peek() in ("+", "-"):
            node = (self.take(), node, self.term())
        return node

    def _starts_atom(self) -> bool:
        tok = self.peek()
        return tok is not None and (tok[0].isalnum() or tok in ("(", "[") or tok[0] == ".")

    def term(self) -> Tree:
        node = self.unary()
        while True:
            if self.peek() in ("*", "/"):
                node = (self.take(), node, self.unary())
            elif self._starts_atom():
                node = ("*", node, self.power())
            else:
                return node

    def unary(self) -> Tree:
        if self.peek() in ("-", "+"):
            op = self.take()
            inner = self.unary()
            return ("neg", inner) if op == "-" else inner
        return self.power()

    def power(self) -> Tree:
        base = self.postfix()
        if self.peek() == "^":
            self.take()
            return ("^", base, self.unary())
        return base

    def postfix(self) -> Tree:
        node = self.atom()
        while self.peek() == "!":
            self.take()
            node = ("fact", node)
        return node

    def atom(self) -> Tree:
        tok = self.take()
        if tok in ("(", "["):
            node = self.expr()
            self.take(")" if tok == "(" else "]")
            return node
        if tok[0].isdigit() or tok[0] == ".":
            return ("num", Fraction(tok))
        if tok in CONSTS:
            return ("const", tok)
        if tok in FUNCS1 | FUNCS2:
            if self.peek() != "(":  # sqrt 2
                return ("call", tok, [self.power()])
            self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            if len(args) != (2 if tok in FUNCS2 else 1):
                raise ParseError(f"{tok} takes {2 if tok in FUNCS2 else 1} argument(s)")
            return ("call", tok, args)
        if tok.isalpha():
            return ("var", tok)
        raise ParseError(f"unexpected {tok!r}")


def parse(text: str) -> Tree:
    """Parse plain/LaTeX math into a tree; raises :class:`ParseError`."""
    toks = _tokens(delatex(text))
    if not toks:
        raise ParseError("empty")
    p = _Parser(toks)
    tree = p.expr()
    if p.peek() is not None:
        raise ParseError(f"trailing {p.peek()!r}")
    return tree


def variables(tree: Tree) -> set[str]:
    """Free variables of a tree."""
    if tree[0] == "var":
        return {tree[1]}
    if tree[0] == "call":
        return set().union(*(variables(a) for a in tree[2]))
    return set().union(*(variables(x) for x in tree[1:] if isinstance(x, tuple)))


def _int(v: Value) -> int:
    if isinstance(v, Fraction) and v.denominator == 1:
        return v.numerator
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise ValueError("not an integer")


def _check(v: Value) -> Value:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("not finite")
    if isinstance(v, Fraction) and max(abs(v.numerator), v.denominator).bit_length() > 16700:
        raise ValueError("too large")
    return v


def _pow(a: Value, b: Value) -> Value:
    if isinstance(b, Fraction) and b.denominator == 1 and isinstance(a, Fraction):
        if abs(b.numerator) > 10000:
            raise ValueError("exponent too large")
        return a ** b.numerator
    if isinstance(a, Fraction) and isinstance(b, Fraction) and a > 0:
        root = _exact_root(a, b.denominator)
        if root is not None:
            return root ** b.numerator
    return float(a) ** float(b)


def _exact_root(a: Fraction, k: int) -> Fraction | None:
    if k > 64:
        return None
    num, den = round(a.numerator ** (1 / k)), round(a.denominator ** (1 / k))
    return Fraction(num, den) if num ** k == a.numerator and den ** k == a.denominator else None


def evaluate(tree: Tree, env: dict[str, Value] | None = None) -> Value:
    """Value of ``tree``; raises ``ValueError``/``ZeroDivisionError``/``OverflowError``."""
    env = env or {}
    kind = tree[0]
    if kind == "num":
        return tree[1]
    if kind == "var":
        if tree[1] not in env:
            raise ValueError(f"unbound {tree[1]}")
        return env[tree[1]]
    if kind == "const":
        return math.pi
    if kind == "neg":
        return -evaluate(tree[1], env)
    if kind == "fact":
        n = _int(evaluate(tree[1], env))
        if not 0 <= n <= 2000:
            raise ValueError("factorial out of range")
        return Fraction(math.factorial(n))
    if kind == "call":
        args = [evaluate(a, env) for a in tree[2]]
        return _check(_call(tree[1], args))
    a, b = evaluate(tree[1], env), evaluate(tree[2], env)
    if kind == "+":
        return _check(a + b)
    if kind == "-":
        return _check(a - b)
    if kind == "*":
        return _check(a * b)
    if kind == "/":
        return _check(a / b)
    if kind == "^":
        return _check(_pow(a, b))
    raise ValueError(kind)


def _call(name: str, args: list[Value]) -> Value:
    x = args[0]
    if name == "sqrt":
        if isinstance(x, Fraction) and x >= 0:
            root = _exact_root(x, 2)
            if root is not None:
                return root
        return math.sqrt(float(x))
    if name == "floor":
        return Fraction(math.floor(x))
    if name == "ceil":
        return Fraction(math.ceil(x))
    if name == "abs":
        return abs(x)
    if name == "exp":
        return math.exp(float(x))
    if name in ("ln", "log"):
        return math.log(float(x))
    n, k = _int(args[0]), _int(args[1])
    if not 0 <= n <= 5000:
        raise ValueError("binomial out of range")
    return Fraction(math.comb(n, k)) if k >= 0 else Fraction(0)


def same_value(a: Value, b: Value) -> bool:
    """Exact equality for two exact values, else ``isclose`` (rel and abs 1e-6)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)


def sample_points(names: list[str], count: int = 7) -> list[dict[str, Value]]:
    """Deterministic small-integer assignments (distinct per variable) for identity tests."""
    bases = [3, 4, 5, 6, 7, 9, 12, 2, 10, 11]
    return [{v: Fraction(bases[(k + 3 * i) % len(bases)] + i) for i, v in enumerate(sorted(names))}
            for k in range(count)]


def equivalent(a: Tree, b: Tree, min_points: int = 3) -> bool:
    """True iff reference ``a`` and candidate ``b`` agree numerically (at sample points when
    they have variables; a candidate variable the reference lacks is a mismatch)."""
    names = variables(a) | variables(b)
    if variables(b) - variables(a):
        return False
    agree = 0
    for env in sample_points(list(names)) if names else [{}]:
        try:
            va = evaluate(a, env)
        except (ValueError, ZeroDivisionError, OverflowError):
            va = None
        try:
            vb = evaluate(b, env)
        except (ValueError, ZeroDivisionError, OverflowError):
            vb = None
        if va is None and vb is None:
            continue
        if va is None or vb is None or not same_value(va, vb):
            return False
        agree += 1
    return agree >= (min_points if names else 1)
