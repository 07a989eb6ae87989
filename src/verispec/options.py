"""The one schema of a request's options: each option declared once (name, type, default, range, help, where it
applies, its name in an HTTP body), and the one check that refuses bad values with the same words at every front
door.

The front doors are views of this table: :class:`verispec.runtime.types.Request` (its fields),
:meth:`verispec.runtime.engine.Engine.generate` and :func:`verispec.generate` (their keyword arguments and
signatures), ``verispec generate`` (its options and ``--help``) and ``verispec serve``'s request bodies (their
fields and OpenAPI schema). Adding a sampling option is one :class:`Option` here plus its implementation
(:class:`verispec.core.sampling.SamplingConfig` for a ``sampling`` option, the engine for a ``request`` one).

Floor 0: nothing here imports torch, pydantic or another verispec module but :mod:`verispec.defaults`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verispec.defaults import (
    AUTO,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_RULE,
    DEFAULT_TEMPERATURE,
    DEFAULT_VERIFIER,
    LOGIT_BIAS_LIMIT,
    LOGPROBS_MODES,
    MAX_GAMMA,
    MAX_SEED,
    MAX_TOP_LOGPROBS,
    SERVING_GAMMA,
    VERIFIERS,
)

__all__ = ["GREEDY_LOSSY", "OPTIONS", "Option", "OptionError", "check", "check_all", "options"]

#: how a lossy rule verifies at temperature 0 (see the ``greedy_lossy`` option)
GREEDY_LOSSY = ("reference", "onehot")

_EVERY = "every rule, verifier and backend"


class OptionError(ValueError):
    """A bad option value; ``name`` is the option's name as the caller wrote it (the server's field path, the
    API's keyword), so that a server answers 400 naming the field."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class Option:
    """One request option, as data.

    ``kind``: how a value is read and checked: "float", "int", "str" (with ``choices``), "rule" (a name or a
    rule object), "bool", "gamma" (an int
    in [0, MAX_GAMMA] or "auto"), "stop" (a string or a list of strings), "logit_bias" (token id -> bias),
    "object" (a JSON object: ``response_format``), "budget" (a mapping or ``"tv=EPS,tv_total=B"``).
    ``group``: "sampling" (a :class:`~verispec.core.sampling.SamplingConfig` field, applied to p and q alike) or
    "request" (a :class:`~verispec.runtime.types.Request` field). ``server``: the field of an HTTP body (dotted:
    nested in ``verification`` or ``speculative``), or None where the server reads the option its own way (chat
    logprobs, echo). ``cli``: whether ``verispec generate`` has ``--NAME`` for it; ``cli_help`` replaces ``help``
    there when the command line needs other words (a text form).
    """

    name: str
    kind: str
    default: Any
    help: str
    group: str = "request"
    nullable: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    applies: str = _EVERY
    server: str | None = ""
    cli: bool = True
    cli_help: str | None = None

    @property
    def field(self) -> str | None:
        """The HTTP body's field path ('' in the declaration means the option's own name)."""
        return self.name if self.server == "" else self.server

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def range_text(self) -> str:
        """The allowed values in words (empty when any value of the kind is allowed)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        parts = []
        for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)):
            if bound is not None:
                parts.append(f"{op} {bound:g}")
        return " and ".join(parts)

    def json_schema(self) -> dict[str, Any]:
        """The option's JSON Schema (an OpenAPI property): type, range, choices, default, description."""
        base: dict[str, Any]
        if self.kind in ("float", "int"):
            base = {"type": "number" if self.kind == "float" else "integer"}
            for key, bound in (("minimum", self.ge), ("exclusiveMinimum", self.gt), ("maximum", self.le),
                               ("exclusiveMaximum", self.lt)):
                if bound is not None:
                    base[key] = bound
        elif self.kind in ("str", "rule"):
            base = {"type": "string"}
            if self.choices:
                base["enum"] = list(self.choices)
        elif self.kind == "bool":
            base = {"type": "boolean"}
        elif self.kind == "gamma":
            base = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_GAMMA}, {"const": AUTO}]}
        elif self.kind == "stop":
            base = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        elif self.kind == "logit_bias":
            base = {"type": "object", "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT,
                                                                "maximum": LOGIT_BIAS_LIMIT}}
        elif self.kind == "budget":
            base = {"type": "object", "properties": {"tv": {"type": "number"}, "tv_total": {"type": "number"}}}
        else:
            base = {"type": "object"}
        out = {"anyOf": [base, {"type": "null"}]} if self.nullable or self.server else dict(base)
        if self.default is not None:
            out["default"] = self.default
        out["description"] = self.help
        return out

    # ------------------------------------------------------------------ checking

    def _bad(self, name: str, what: str, value: object) -> OptionError:
        return OptionError(name, f"{name} must be {what}, got {value!r}")

    def check(self, value: Any, name: str | None = None, json_body: bool = False) -> Any:
        """``value`` checked (and normalized: a stop string becomes a list); OptionError naming ``name`` (default:
        the option's name) otherwise. None passes where the option is nullable. ``json_body``: the value comes from
        a JSON object, whose keys are strings (logit_bias' token ids are then read from their digits)."""
        name = name or self.name
        if value is None and self.nullable:
            return None
        k = self.kind
        if k in ("float", "int"):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if k == "int" and not isinstance(value, int):
                ok = False
            if not ok:
                raise self._bad(name, "an integer" if k == "int" else "a number", value)
            if k == "float":
                try:  # an int too large for a float overflows rather than compare (10**400 from a JSON body)
                    finite = math.isfinite(value)
                except OverflowError:
                    finite = False
                if not finite:
                    raise self._bad(name, "a finite number", value)
            for bound, fails, words in ((self.ge, lambda b: value < b, "greater than or equal to"),
                                        (self.gt, lambda b: value <= b, "greater than"),
                                        (self.le, lambda b: value > b, "less than or equal to"),
                                        (self.lt, lambda b: value >= b, "less than")):
                if bound is not None and fails(bound):
                    raise self._bad(name, f"{words} {bound:g}", value)
            return value
        if k == "str":
            if not isinstance(value, str):
                raise self._bad(name, "a string", value)
            if self.choices and value not in self.choices:
                raise OptionError(name, f"{name}: unknown {self.name} {value!r}; available: {', '.join(self.choices)}")
            return value
        if k == "rule":  # a registered name (checked by the rule registry) or a rule object
            if not isinstance(value, str) and not hasattr(value, "lossless"):
                raise self._bad(name, "a rule name (see `verispec rules`) or a Rule", value)
            return value
        if k == "bool":
            if not isinstance(value, bool):
                raise self._bad(name, "true or false", value)
            return value
        if k == "gamma":
            if value == AUTO:
                return value
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_GAMMA:
                raise self._bad(name, f"in [0, {MAX_GAMMA}] or '{AUTO}'", value)
            return value
        if k == "stop":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
                raise self._bad(name, "a string or a list of strings", value)
            if any(s == "" for s in items):  # it would match before every token: refused, as vLLM refuses it
                raise self._bad(name, "non-empty strings", value)
            return list(items)
        if k == "logit_bias":
            if not isinstance(value, Mapping):
                raise self._bad(name, "an object mapping token ids to biases", value)
            out: dict[int, float] = {}
            given: dict[int, Any] = {}  # token -> the key that named it ("1" and "01" name one token)
            for key, bias in value.items():
                tok = key if isinstance(key, int) and not isinstance(key, bool) else None
                if json_body and isinstance(key, str) and key.strip().lstrip("-").isascii() \
                        and key.strip().lstrip("-").isdigit():  # "²" is a digit to isdigit(), not to int()
                    tok = int(key)
                if tok is None or tok < 0:
                    raise OptionError(name, f"{name}: keys must be token ids (integers >= 0), got {key!r}")
                if tok in given:
                    raise OptionError(name, f"{name}: token {tok} is given twice ({given[tok]!r} and {key!r})")
                given[tok] = key
                if not isinstance(bias, int | float) or isinstance(bias, bool) \
                        or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                    raise OptionError(name, f"{name}: the bias of token {tok} must be a number in "
                                            f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {bias!r}")
                out[tok] = float(bias)
            return out or None
        if k == "object":
            if not isinstance(value, Mapping):
                raise self._bad(name, "a JSON object", value)
            return dict(value)
        if k == "budget":
            if isinstance(value, str) or isinstance(value, Mapping) or hasattr(value, "tv_total"):
                return value  # its keys and values: Budget.parse (core), where the budget is implemented
            raise self._bad(name, "an object {\"tv\": EPS, \"tv_total\": B} or text 'tv=EPS'", value)
        raise AssertionError(f"option {self.name}: unknown kind {k!r}")

    def parse_text(self, text: str | tuple[str, ...]) -> Any:
        """A command-line value (text; a tuple for a repeatable option) -> the option's value, checked."""
        name, k = self.flag, self.kind
        if k in ("float", "int"):
            try:  # an integer's text stays an int (as JSON reads it), so the refusals read alike
                value: Any = int(text) if k == "int" or str(text).strip().lstrip("+-").isdigit() \
                    else float(text)  # type: ignore[arg-type]
            except ValueError:
                raise self._bad(name, "an integer" if k == "int" else "a number", text) from None
        elif k == "gamma":
            value = text if text == AUTO else None
            if value is None:
                try:
                    value = int(text)  # type: ignore[arg-type]
                except ValueError:
                    raise self._bad(name, f"in [0, {MAX_GAMMA}] or '{AUTO}'", text) from None
        elif k == "stop":
            value = list(text)
        elif k == "logit_bias":
            value = {}
            given: dict[int, str] = {}  # token -> the item that named it: a repeat is refused, as in a JSON body
            for item in text:
                tok, sep, bias = item.partition("=")
                try:
                    if not sep:
                        raise ValueError
                    tok_id, bias_value = int(tok), float(bias)
                except ValueError:
                    raise OptionError(name, f"{name} expects TOKEN_ID=BIAS (e.g. 151643=-100), got {item!r}") from None
                if tok_id in given:
                    raise OptionError(name, f"{name}: token {tok_id} is given twice ({given[tok_id]!r} and {item!r})")
                given[tok_id] = item
                value[tok_id] = bias_value
        elif k == "object":
            try:
                value = json.loads(text)  # type: ignore[arg-type]
            except json.JSONDecodeError as exc:
                raise OptionError(name, f"{name} is not valid JSON: {exc}") from None
        else:
            value = text
        return self.check(value, name)


def _o(*args: Any, **kw: Any) -> Option:
    return Option(*args, **kw)


#: every request option, in the order the front doors list them
OPTIONS: dict[str, Option] = {o.name: o for o in (
    # ---- sampling: the processors that define p and q (core/sampling.py), applied to target and draft alike
    _o("temperature", "float", DEFAULT_TEMPERATURE, "Sampling temperature; 0 means greedy.", "sampling",
       ge=0, le=2),
    _o("top_p", "float", None, "Nucleus sampling: keep the most probable tokens up to this mass.", "sampling",
       nullable=True, gt=0, le=1),
    _o("top_k", "int", None, "Keep the k most probable tokens.", "sampling", nullable=True, ge=1),
    _o("min_p", "float", None, "min-p p_base (Eq. 5): keep tokens of probability >= p_base x the top one.",
       "sampling", nullable=True, ge=0, le=1),
    _o("eta", "float", None, "eta-sampling epsilon (Eq. 6).", "sampling", nullable=True, gt=0, le=1),
    # [0.1, 10]: a penalty and its inverse are mirror images; far below 0.1 dividing the logits overflows them
    _o("repetition_penalty", "float", 1.0, "Repetition penalty (CTRL style, over prompt and output; 1: off).",
       "sampling", ge=0.1, le=10),
    _o("frequency_penalty", "float", 0.0, "Frequency penalty (per occurrence in the output; 0: off).", "sampling",
       ge=-2, le=2),
    _o("presence_penalty", "float", 0.0, "Presence penalty (once per token present in the output; 0: off).",
       "sampling", ge=-2, le=2),
    _o("logit_bias", "logit_bias", None, f"Token id -> a bias in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}] "
       "added to its logit, for target and draft alike.", "sampling", nullable=True,
       cli_help="Add BIAS (in [-100, 100]) to a token's logit, for target and draft alike."),
    # ---- the request
    _o("rule", "rule", DEFAULT_RULE, "Verification rule (see `verispec rules`); its parameters: rule_params "
       "(verification.params in a request body).", server="verification.rule",
       cli_help="Verification rule (see `verispec rules`); its parameters: --param NAME=VALUE."),
    _o("gamma", "gamma", SERVING_GAMMA, f"Draft length per round (tree: depth), or '{AUTO}': chosen each round "
       "from measured costs and acceptance, 0 (plain decoding) when drafting does not pay. Give a number to make a "
       "seeded sampled run reproducible.", server="speculative.gamma"),
    _o("max_new_tokens", "int", DEFAULT_MAX_NEW_TOKENS, "Most tokens to generate.", ge=1, server="max_tokens"),
    _o("stop", "stop", (), "Stop string(s); the output is cut before the first one.", nullable=True),
    _o("seed", "int", 0, "Random seed of the request (the server's default: a fresh one per request).", ge=0,
       lt=MAX_SEED),
    _o("chat", "bool", False, "Wrap the prompt in the model's chat template.", server=None),
    _o("greedy_lossy", "str", "reference", "A lossy rule at temperature 0: 'reference' accepts a draft iff it is "
       "the argmax of the rule's reference distribution (deterministic); 'onehot' applies the rule to the one-hot "
       "p and q (random).", choices=GREEDY_LOSSY, applies="lossy rules at temperature 0",
       server="verification.greedy_lossy"),
    _o("verifier", "str", DEFAULT_VERIFIER, "; ".join(f"{k}: {v.help}" for k, v in VERIFIERS.items()) + ".",
       choices=tuple(VERIFIERS), applies="block and hsd: lossless rules, chains", server="verification.verifier"),
    _o("logprobs", "int", None, "Each generated token's log-probability and this many alternatives.",
       nullable=True, ge=0, le=MAX_TOP_LOGPROBS, server=None),
    _o("logprobs_mode", "str", "emitted", "emitted: the law each token was emitted from (under a lossy rule, its "
       "exact induced law); target: the processed target distribution.", choices=LOGPROBS_MODES,
       server="verification.logprobs_mode"),
    _o("prompt_logprobs", "int", None, "Each prompt token's log-probability under the target, with this many "
       "alternatives.", nullable=True, ge=0, le=MAX_TOP_LOGPROBS, server=None, cli=False),
    _o("token_details", "int", None, "Per emitted token: how it was emitted (accepted draft, correction or "
       "bonus), p, q and the rule's induced law over this many most probable tokens, the drafted token's acceptance "
       "probability and the TV of the induced law from p (verispec.runtime.details).", nullable=True, ge=0,
       le=MAX_TOP_LOGPROBS, applies="chains", server="verification.token_details", cli=False),
    _o("response_format", "object", None, "Structured output: {\"type\": \"json_object\"}, {\"type\": "
       "\"json_schema\", \"json_schema\": {\"schema\": {...}}}, {\"type\": \"regex\", \"regex\": \"...\"} or "
       "{\"type\": \"grammar\", \"grammar\": \"<Lark>\"}; a constraint on target and draft alike.", nullable=True),
    _o("budget", "budget", None, "A divergence budget on the rule's parameter: {\"tv\": EPS} (every position's "
       "induced law within TV EPS of the target's) and / or {\"tv_total\": B} (the whole sequence's).",
       nullable=True, applies="lenience, cos-we; overshoot-ceiling and minp-cap in the residual realization",
       server="verification.budget", cli_help="A divergence budget, tv=EPS[,tv_total=B]: at each position the "
       "parameter of the rule that accepts most among those whose exact induced law is within TV EPS of the "
       "target's; tv_total bounds the whole sequence's TV."),
)}


def options(group: str | None = None) -> list[Option]:
    """The options, in declaration order (of one group: "sampling" or "request")."""
    return [o for o in OPTIONS.values() if group is None or o.group == group]


def check(name: str, value: Any, label: str | None = None) -> Any:
    """``OPTIONS[name].check(value)``: the one check every front door runs."""
    return OPTIONS[name].check(value, label)


def check_all(values: Mapping[str, Any], names: Iterable[str] | None = None) -> dict[str, Any]:
    """Every given option checked; a TypeError for a name that is no option (as Python says it)."""
    out = {}
    for key, value in values.items():
        if key not in OPTIONS or (names is not None and key not in names):
            raise TypeError(f"unexpected keyword argument {key!r}")
        out[key] = OPTIONS[key].check(value)
    return out
