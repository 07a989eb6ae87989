"""Tool calling on the chat endpoint: ``tools``, ``tool_choice`` and the messages of a tool conversation.

The tools reach the model through its own chat template (``apply_chat_template(..., tools=...)``: Qwen2.5 lists
them in the system prompt and asks for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``). What the
model writes is read back into OpenAI ``tool_calls``:

- ``tool_choice: "auto"`` (the default with tools): the model decides; every well-formed ``<tool_call>`` block
  naming a given function becomes a call (the first one only with ``parallel_tool_calls: false``), the rest of the
  text stays the message's content;
- ``"required"`` or ``{"type": "function", "function": {"name": ...}}``: the answer is constrained to exactly one
  call, ``<tool_call>`` + JSON whose ``name`` is a given function (that one) and whose ``arguments`` follow its
  ``parameters`` schema + ``</tool_call>``, through the same grammar constraint as ``response_format`` (applied to
  target and draft alike, so lossless verification stays exact), so the arguments always parse and validate;
- ``"none"``: the tools are left out of the prompt and nothing is parsed.

A stream with tools sends the answer when it is complete (the calls cannot be told from text before their block
closes): the content, then the calls as one ``tool_calls`` delta each, then the finish chunk.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolCalling", "parse_tool_calling", "split_tool_calls", "template_messages"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


class ToolError(ValueError):
    """A bad ``tools`` / ``tool_choice`` / tool message; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCalling:
    """A request's tools (OpenAI ``{"type": "function", "function": {...}}`` objects, checked) and its choice:
    ``"auto"``, ``"required"`` or the name of the one function to call."""

    tools: tuple[dict[str, Any], ...]
    choice: str
    #: ``parallel_tool_calls``: False reads at most one call from an answer
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def forced(self) -> bool:
        """The answer must be a call (``required`` or a named function)."""
        return self.choice != "auto"

    def split(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """:func:`split_tool_calls` of an answer under these tools (one call at most unless ``parallel``)."""
        return split_tool_calls(text, self.names, None if self.parallel else 1)

    def response_format(self, literal: Callable[[str], str] = json.dumps) -> dict[str, Any] | None:
        """The grammar of a forced call (None for ``auto``): ``<tool_call>\n{"name": N, "arguments": A}\n
        </tool_call>``, N a permitted function's name and A valid under that function's ``parameters``.

        ``literal`` writes each marker as a Lark expression; pass the engine's
        :meth:`~verispec.runtime.grammar.GrammarCompiler.literal`, which writes a marker as its token where the
        grammar library holds that token special (and would refuse it against the text), else as text. The default
        (text) suits a tokenizer where the marker is plain text."""
        if not self.forced:
            return None
        names = self.names if self.choice == "required" else (self.choice,)
        by_name = {t["function"]["name"]: t["function"] for t in self.tools}
        options = [{"type": "object", "properties": {"name": {"const": n}, "arguments": _arguments(by_name[n])},
                    "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        start, end = f'{literal(OPEN)} "\\n"', f'"\\n" {literal(CLOSE)}'
        lark = f"start: {start} call {end}\ncall: %json {json.dumps(schema)}\n"
        return {"type": "grammar", "grammar": lark}


def _arguments(fn: dict[str, Any]) -> dict[str, Any]:
    """The schema a forced call's ``arguments`` follow: the function's ``parameters``, always an object (a schema
    without a ``type``, e.g. only ``properties``, admits any JSON value, which :func:`split_tool_calls` would not
    read as a call)."""
    return {**(fn.get("parameters") or {}), "type": "object"}


def parse_tool_calling(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None = None) -> ToolCalling | None:
    """The request's ``tools`` and ``tool_choice`` checked (:class:`ToolError` naming the field), or None when no
    tool may be called (no tools, or ``tool_choice: "none"``); ``parallel_tool_calls: false`` allows one call."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolError("tools must be a list of function tools", "tools")
    checked = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ToolError(f'{where}.type must be "function"', f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ToolError(f"{where}.function must be an object", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}",
                            f"{where}.function.name")
        params = fn.get("parameters")
        if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
            # a call's arguments are a JSON object: a schema of another type could only be forced into text
            raise ToolError(f'{where}.function.parameters must be a JSON Schema object of type "object"',
                            f"{where}.function.parameters")
        if "description" in fn and not isinstance(fn["description"], str):
            raise ToolError(f"{where}.function.description must be a string", f"{where}.function.description")
        checked.append({"type": "function", "function": {k: fn[k] for k in ("name", "description", "parameters")
                                                         if k in fn}})
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise ToolError("tools: two functions share a name", "tools")
    if tool_choice is None or tool_choice == "auto":
        choice = "auto"
    elif tool_choice == "none":
        return None
    elif tool_choice == "required":
        choice = "required"
    elif (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
          and isinstance(tool_choice.get("function"), dict)):
        choice = tool_choice["function"].get("name")
        if choice not in names:
            raise ToolError(f"tool_choice names {choice!r}, which is not among the tools", "tool_choice")
    else:
        raise ToolError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                        '{"name": ...}}', "tool_choice")
    return ToolCalling(tuple(checked), choice, parallel_tool_calls is not False)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool-conversation messages in the form chat templates take: an assistant message's ``tool_calls``
    with their ``arguments`` parsed from JSON text into objects; ``tool`` messages kept with their content."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if not calls:
            out.append(m)
            continue
        if m.get("role") != "assistant" or not isinstance(calls, list):
            raise ToolError(f"messages[{i}].tool_calls: only an assistant message carries a list of tool calls",
                            f"messages[{i}].tool_calls")
        parsed = []
        for j, call in enumerate(calls):
            where = f"messages[{i}].tool_calls[{j}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ToolError(f"{where}.function must be an object with a name", f"{where}.function")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args or "{}")
                except json.JSONDecodeError as exc:
                    raise ToolError(f"{where}.function.arguments is not JSON: {exc}",
                                    f"{where}.function.arguments") from None
            if not isinstance(args, dict):
                raise ToolError(f"{where}.function.arguments must be a JSON object", f"{where}.function.arguments")
            parsed.append({"type": "function", "id": call.get("id"), "function": {"name": fn["name"],
                                                                                  "arguments": args}})
        out.append({**m, "content": m.get("content") or "", "tool_calls": parsed})
    return out


def split_tool_calls(text: str, names: tuple[str, ...], limit: int | None = None
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a generated answer: each ``<tool_call>`` block holding a JSON object with a
    known ``name`` and object ``arguments`` becomes an OpenAI tool call (arguments as JSON text, a fresh id), the
    first ``limit`` of them when given; those blocks leave the content, whatever else stays (None when nothing
    does)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for block in _BLOCK.finditer(text):
        if limit is not None and len(calls) >= limit:
            break
        try:
            obj = json.loads(block.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(obj, dict) and obj.get("name") in names and isinstance(obj.get("arguments", {}), dict)):
            continue
        kept.append(text[pos:block.start()])
        pos = block.end()
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}})
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls
