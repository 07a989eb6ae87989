"""OpenAI request bodies -> validated verispec settings, with errors that name the offending field.

The sampling and verification fields of both endpoints are the request schema's (:data:`verispec.options.OPTIONS`,
each option's ``field``: top level, or nested in verispec's own ``verification`` object ``{"rule", "params",
"verifier", "logprobs_mode", "budget", ...}`` and ``speculative`` object ``{"gamma": N | "auto"}``, which the
official client sends through ``extra_body``), checked by the schema with the words of every front door. The
server's own fields: ``model``, ``max_tokens`` (chat also ``max_completion_tokens``), ``seed`` (default: a fresh
random seed per request), ``logprobs`` (chat: ``true`` with ``top_logprobs`` in [0, 20]; completions: the number
of alternatives, 0-20), completions ``echo`` (with ``logprobs``: the prompt's tokens scored too), ``n`` (1-16
choices: rows of the batch, choice i sampled with seed + i, modulo 2^63), ``stream``,
``stream_options.include_usage``. Chat: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (function tools
through the model's chat template, forced calls constrained to their schemas, one call at most with
``parallel_tool_calls: false``; :mod:`verispec.server.tools`) and the ``tool`` / assistant
``tool_calls`` messages of a tool conversation.
``user``, ``metadata``, ``store`` and other fields without effect on the output are accepted and ignored. Fields
that would change what is generated or returned (``best_of`` > 1, chat ``echo``, legacy ``functions``, ...) are
refused with 400 naming the field, as is any field this server does not know. ``response_format``: ``text``,
``json_object``, ``json_schema`` and the extensions ``regex`` and ``grammar`` (Lark), a constraint on target and
draft alike (:mod:`verispec.runtime.grammar`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, create_model

from verispec.core import rules
from verispec.core.rules.budget import Budget, family_of
from verispec.core.sampling import SamplingConfig
from verispec.core.verify.tree import check_tree_rule
from verispec.defaults import DEFAULT_CONTEXT, MAX_GAMMA, MAX_TOP_LOGPROBS, check_verifier
from verispec.options import OPTIONS, OptionError, options
from verispec.runtime.engine import Engine
from verispec.runtime.grammar import check_response_format
from verispec.runtime.types import Request
from verispec.server.tools import ToolCalling, ToolError, parse_tool_calling, template_messages

__all__ = [
    "MAX_CHOICES",
    "MAX_GAMMA",
    "APIError",
    "ChatCompletionRequest",
    "CompletionRequest",
    "Limits",
    "Settings",
    "parse_body",
    "prompt_builder",
]

#: the most choices (``n``) one request may ask for; each is a row of the batch and takes a concurrency slot
MAX_CHOICES = 16


class APIError(Exception):
    """An error answered with an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _harmless(value: object) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


#: fields that change what is generated or returned: refused unless the value is a no-op
UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "tools": _harmless,
    "tool_choice": lambda v: _harmless(v) or v == "none",
    "functions": _harmless,
    "function_call": lambda v: _harmless(v) or v == "none",
    "best_of": lambda v: _harmless(v) or v == 1,
    "echo": _harmless,
    "suffix": _harmless,
    "audio": _harmless,
    "modalities": lambda v: _harmless(v) or v == ["text"],
    "prediction": _harmless,
    "web_search_options": _harmless,
    "reasoning_effort": _harmless,
    "verbosity": _harmless,
}
#: fields without effect on the output here: accepted and ignored
IGNORED = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "parallel_tool_calls")


def _schema_fields(prefix: str) -> dict[str, Any]:
    """The request schema's options whose body field lies at ``prefix`` ("" top level, "verification.",
    "speculative."), as pydantic fields: any JSON value (the schema's own check refuses bad ones with the words of
    every front door), documented in the OpenAPI schema with the option's type, range, default and help."""
    out: dict[str, Any] = {}
    for opt in OPTIONS.values():
        path = opt.field
        if path is None or not path.startswith(prefix) or "." in path[len(prefix):]:
            continue
        out[path[len(prefix):]] = (Any, Field(None, json_schema_extra=opt.json_schema()))  # type: ignore[arg-type]
    return out


class _VerificationBase(BaseModel):
    """``verification``: the rule that verifies this request's drafts, its parameters and how it is verified and
    reported (the request schema's ``verification.*`` options)."""

    model_config = ConfigDict(extra="forbid")
    #: the rule's parameters (:func:`verispec.core.rules.from_request` checks them against the rule)
    params: dict[str, Any] = Field(default_factory=dict)


Verification = create_model("Verification", __base__=_VerificationBase, **_schema_fields("verification."))


class _SpeculativeBase(BaseModel):
    """``speculative``: how drafts are proposed (the request schema's ``speculative.*`` options)."""

    model_config = ConfigDict(extra="forbid")


Speculative = create_model("Speculative", __base__=_SpeculativeBase, **_schema_fields("speculative."))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool | None = False  # null: false, as OpenAI's schema allows


class _ServerFields(BaseModel):
    """The fields only the server has (the rest come from the request schema)."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    n: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES)
    stream: StrictBool | None = False  # null: false
    stream_options: StreamOptions | None = None
    verification: Verification | None = None  # type: ignore[valid-type]
    speculative: Speculative | None = None  # type: ignore[valid-type]


_Common = create_model("_Common", __base__=_ServerFields, **_schema_fields(""))


class CompletionRequest(_Common):
    """``POST /v1/completions``: one prompt (text, or token ids)."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    #: alternatives per token (0: the chosen token's logprob only); None: no logprobs
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    #: the prompt first in the text (and, with logprobs, its tokens' logprobs: log-likelihood evaluation)
    echo: StrictBool | None = False  # null: false


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``: a list of messages rendered with the model's chat template."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    #: function tools (:mod:`verispec.server.tools`), checked there so that errors name the field
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    #: false: at most one tool call per answer
    parallel_tool_calls: StrictBool | None = None


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[int]", "list[str]", "list[list[int]]", "int", "literal['auto']"):
            continue  # pydantic's union branch names
        else:
            out += ("." if out else "") + str(part)
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(data: Any) -> tuple | None:
    """The location of the first string (value or key) holding a lone surrogate, else None. JSON's \\u escapes
    decode a valid pair to one character, so only unpaired halves are left in the parsed strings."""
    stack: list[tuple[tuple, Any]] = [((), data)]
    while stack:
        loc, x = stack.pop()
        if isinstance(x, str):
            if _SURROGATE.search(x):
                return loc
        elif isinstance(x, dict):
            for k, v in x.items():
                if _SURROGATE.search(k):  # escaped: the location is sent back in the error
                    return (*loc, k.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))
                stack.append(((*loc, k), v))
        elif isinstance(x, list):
            stack.extend(((*loc, i), v) for i, v in enumerate(x))
    return None


def parse_body(raw: bytes, model: type[_Common]) -> _Common:
    """Parse a JSON body into ``model``: 400 naming the problem for malformed JSON, refused, unknown or invalid
    fields."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise APIError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise APIError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    if (where := _lone_surrogate(data)) is not None:  # no text: it could not even be written back as UTF-8
        raise APIError(400, f"{_param(where) or 'the body'}: a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                       "without its pair) is not text", param=_param(where), code="invalid_value")
    for name in IGNORED:
        if name == "parallel_tool_calls" and model is ChatCompletionRequest:
            continue  # chat reads it: false allows one call
        data.pop(name, None)
    for name, ok in UNSUPPORTED.items():
        if name == "echo" and model is CompletionRequest:
            continue  # completions echo the prompt (and score it with logprobs)
        if name in ("tools", "tool_choice") and model is ChatCompletionRequest:
            continue  # chat calls tools
        if name in data and not ok(data[name]):
            raise APIError(400, f"{name} is not supported by this server", param=name, code="unsupported_field")
        data.pop(name, None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(err["loc"])
        if err["type"] == "extra_forbidden":
            raise APIError(400, f"unknown field {param!r}", param=param, code="unknown_field") from None
        raise APIError(400, f"{param}: {err['msg']}", param=param, code="invalid_value") from None


@dataclass
class Limits:
    """Server-wide limits (``verispec serve`` options)."""

    #: longest prompt accepted (None: whatever leaves room in the model's context)
    max_prompt_tokens: int | None = None
    #: largest max_tokens a request may ask for
    max_tokens_limit: int = DEFAULT_CONTEXT
    #: max_tokens of a completion that gives none (the OpenAI API's default for /v1/completions)
    default_completion_tokens: int = 16
    #: most stop strings a request may give (each is searched for in the output after every round, on the one
    #: thread that runs every request's rounds)
    max_stop_strings: int = 64


@dataclass
class Settings:
    """A request's validated settings: the rule, the sampling config and the other request-schema options given
    (``options``: name -> checked value; the rest take the schema's defaults), and the server's own fields."""

    rule: rules.Rule
    sampling: SamplingConfig
    options: dict[str, Any]
    max_tokens: int | None
    seed: int
    stream: bool
    include_usage: bool
    echo: bool = False
    #: choices; choice i is generated with ``(seed + i) mod 2**63``
    n: int = 1
    #: the tools a chat request may call (None: none)
    tools: ToolCalling | None = None

    def get(self, name: str) -> Any:
        """A request option's value (the schema's default where the body gave none)."""
        return self.options.get(name, OPTIONS[name].default)

    @property
    def gamma(self) -> int | str:
        return self.get("gamma")

    @property
    def verifier(self) -> str:
        return self.get("verifier")

    @property
    def stop(self) -> list[str]:
        return self.get("stop") or []

    @property
    def logprobs(self) -> int | None:
        return self.get("logprobs")

    @property
    def response_format(self) -> dict[str, Any] | None:
        return self.get("response_format")

    @property
    def token_details(self) -> int | None:
        """Most probable tokens per distribution in each token's verification details (None: not asked)."""
        return self.get("token_details")

    @classmethod
    def of(cls, req: Any) -> Settings:
        """Map the body's fields onto verispec's rule, sampling and request options (APIError on bad values,
        naming the field; the words are the request schema's, as at every front door)."""
        v = req.verification or Verification()
        spec = req.speculative or Speculative()
        nested = {"verification": v, "speculative": spec}
        values: dict[str, Any] = {}
        for opt in OPTIONS.values():
            if opt.field is None:
                continue
            top, _, sub = opt.field.partition(".")
            raw = getattr(nested[top], sub) if sub else getattr(req, top)
            if raw is None:
                continue
            try:
                values[opt.name] = opt.check(raw, opt.field, json_body=True)
            except OptionError as exc:
                raise APIError(400, str(exc), param=exc.name, code="invalid_value") from None
        try:
            rule = rules.from_request({"rule": values.pop("rule", OPTIONS["rule"].default), "params": v.params})
        except rules.RequestError as exc:
            raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None
        try:
            check_verifier(values.get("verifier", OPTIONS["verifier"].default), rule.lossless, trees=False)
        except ValueError as exc:
            raise APIError(400, str(exc), param="verification.verifier", code="invalid_value") from None
        if values.get("budget") is not None:
            try:
                values["budget"] = Budget.parse(values["budget"])
                family_of(rule)
            except ValueError as exc:
                raise APIError(400, f"verification.budget: {exc}", param="verification.budget",
                               code="invalid_value") from None
        try:
            sampling = SamplingConfig.of({o.name: values.pop(o.name) for o in options("sampling") if o.name in values})
        except ValueError as exc:
            param = "logit_bias" if str(exc).startswith("logit_bias") else None
            raise APIError(400, str(exc), param=param, code="invalid_value") from None
        max_tokens = values.pop("max_new_tokens", None)
        if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
            if max_tokens is not None and max_tokens != req.max_completion_tokens:
                raise APIError(400, f"max_completion_tokens {req.max_completion_tokens} and max_tokens {max_tokens} "
                               "disagree: give one of them", param="max_completion_tokens", code="invalid_value")
            max_tokens = req.max_completion_tokens
        seed = values.pop("seed", None)
        seed = seed if seed is not None else secrets.randbits(63)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        values["response_format"] = _response_format(values.get("response_format"))
        logprobs = _logprobs(req)
        if logprobs is not None:
            values["logprobs"] = logprobs
        tools = None
        if isinstance(req, ChatCompletionRequest):
            try:
                tools = parse_tool_calling(req.tools, req.tool_choice, req.parallel_tool_calls)
            except ToolError as exc:
                raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None
            if tools is not None and tools.forced and values["response_format"] is not None:
                raise APIError(400, "response_format cannot constrain an answer that tool_choice forces to be a "
                               "tool call", param="response_format", code="invalid_value")
        echo = bool(getattr(req, "echo", False))
        return cls(rule, sampling, values, max_tokens, seed, bool(req.stream), include_usage, echo, req.n or 1,
                   tools)


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """The request's response_format, its shape checked (400 naming it); its grammar compiles on the worker."""
    try:
        check_response_format(fmt)
    except ValueError as exc:
        raise APIError(400, str(exc), param="response_format", code="invalid_value") from None
    return None if fmt is None or fmt.get("type") == "text" else fmt


def _logprobs(req: _Common) -> int | None:
    """Alternatives per token asked for (chat: ``top_logprobs`` with ``logprobs: true``), or None."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs  # type: ignore[attr-defined]


def _chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for the chat template: text (system, developer, user, assistant), an assistant's ``tool_calls``
    and ``tool`` results."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(400, f"messages[{i}].role must be system, developer, user, assistant or tool, got "
                           f"{role!r}", param=f"messages[{i}].role", code="invalid_value")
        if m.get("function_call"):
            raise APIError(400, f"messages[{i}].function_call: legacy function calls are not supported; use "
                           "tool_calls", param=f"messages[{i}].function_call", code="unsupported_field")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text content parts are supported",
                               param=f"messages[{i}].content", code="unsupported_field")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                           param=f"messages[{i}].content", code="invalid_value")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    try:
        return template_messages(out)
    except ToolError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None


def _encode_chat(engine: Engine, messages: list[dict[str, Any]], tools: ToolCalling | None = None) -> list[int]:
    tok = engine.tokenizer
    if tok is None or not hasattr(tok, "apply_chat_template"):
        raise APIError(400, "this model has no chat template: use /v1/completions", param="messages")
    try:
        if tools is not None:
            ids = tok.apply_chat_template(messages, tools=list(tools.tools), add_generation_prompt=True,
                                          tokenize=True)
        else:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except TypeError as exc:
        if tools is None:
            raise
        raise APIError(400, f"tools: this model's chat template takes no tools ({exc})", param="tools") from None
    except Exception as exc:  # jinja errors of the template (e.g. roles that must alternate)
        raise APIError(400, f"messages: the chat template refused them: {exc}", param="messages") from None
    if hasattr(ids, "keys"):  # a BatchEncoding from tokenizers that return dicts
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _completion_prompt(prompt: object) -> str | list[int]:
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise APIError(400, f"prompt: one prompt per request is supported, got {len(prompt)}", param="prompt",
                           code="unsupported_field")
        prompt = prompt[0]
    return prompt  # type: ignore[return-value]


def prompt_builder(body: _Common, settings: Settings, limits: Limits) -> Callable[[Engine], Request]:
    """The function the worker thread runs to tokenize the prompt, check the limits and build the Request."""
    chat = isinstance(body, ChatCompletionRequest)
    messages = _chat_messages(body.messages) if chat else None  # type: ignore[attr-defined]
    prompt = None if chat else _completion_prompt(body.prompt)  # type: ignore[attr-defined]

    def build(engine: Engine) -> Request:
        if messages is not None:
            ids = _encode_chat(engine, messages, settings.tools)
        else:
            try:
                ids = engine.encode(prompt)  # type: ignore[arg-type]
            except ValueError as exc:
                raise APIError(400, f"prompt: {exc}", param="prompt") from None
        param = "messages" if chat else "prompt"
        if not ids:
            raise APIError(400, f"{param}: empty prompt", param=param)
        vocab = engine.target.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise APIError(400, f"{param}: token id out of the vocabulary [0, {vocab})", param=param)
        try:
            settings.sampling.check_vocab(vocab)
        except ValueError as exc:
            raise APIError(400, str(exc), param="logit_bias", code="invalid_value") from None
        tools = settings.tools if settings.tools is not None and settings.tools.forced else None
        fmt_param = "response_format" if tools is None else "tools"
        try:
            fmt = settings.response_format if tools is None else tools.response_format(engine.grammar.literal)
            if fmt is not None:
                engine.grammar.grammar(fmt)
        except (ValueError, ImportError) as exc:
            msg = str(exc).replace("response_format", "tools' parameters") if fmt_param == "tools" else str(exc)
            raise APIError(400, msg, param=fmt_param, code="invalid_value") from None
        if engine.proposes_trees:
            try:
                check_tree_rule(settings.rule)
            except ValueError as exc:
                raise APIError(400, f"verification.rule: {exc}", param="verification.rule") from None
        context = engine.target.max_context
        if len(ids) >= context:
            raise APIError(400, f"{param}: the prompt has {len(ids)} tokens; the model's context is {context} "
                           "tokens, which leaves no room for an answer", param=param, code="context_length_exceeded")
        if limits.max_prompt_tokens is not None and len(ids) > limits.max_prompt_tokens:
            raise APIError(400, f"{param}: the prompt has {len(ids)} tokens, over this server's limit of "
                           f"{limits.max_prompt_tokens} (--max-prompt-tokens)", param=param,
                           code="context_length_exceeded")
        if len(settings.stop) > limits.max_stop_strings:
            raise APIError(400, f"stop: {len(settings.stop)} stop strings, over this server's limit of "
                           f"{limits.max_stop_strings}", param="stop", code="invalid_value")
        max_tokens = settings.max_tokens
        name = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"  # type: ignore[attr-defined]
        if max_tokens is not None and max_tokens > limits.max_tokens_limit:
            raise APIError(400, f"{name} {max_tokens} exceeds this server's limit of {limits.max_tokens_limit} "
                           "(--max-tokens-limit)", param=name, code="invalid_value")
        room = context - len(ids)
        if max_tokens is not None and max_tokens > room:
            raise APIError(400, f"{name}: the prompt has {len(ids)} tokens and {name} asks for {max_tokens}, over "
                           f"the model's context of {context} tokens", param=name, code="context_length_exceeded")
        if max_tokens is None:
            default = limits.max_tokens_limit if chat else limits.default_completion_tokens
            max_tokens = min(default, room)
        request_options = {**settings.options, "response_format": fmt}
        if settings.echo:
            request_options["prompt_logprobs"] = settings.logprobs
        return Request(ids, rule=settings.rule, sampling=settings.sampling, max_new_tokens=max_tokens,
                       seed=settings.seed, **request_options)

    return build

