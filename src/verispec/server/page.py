"""The page ``verispec serve`` answers a browser with at ``/``: verification at work, token by token.

The HTML is rendered here, so the controls are on screen before any script runs, and its form is built from the
server's own descriptions, not from a list of its own: the sampling fields from the OpenAPI schema of the chat
request (``app.openapi()``: each field's type, default and range), the rules and each parameter's range from the
rule registry (:func:`verispec.core.rules.describe`), the verifiers from the ``verification`` schema (or
:data:`verispec.defaults.VERIFIERS`) and the drafter from the engine that runs. The script
(``static/page.js``, no build step, nothing loaded from outside) sends what a client would send: a streamed
request to ``/v1/chat/completions`` or ``/v1/completions`` with ``verification.token_details``, and draws each
token with its mark; the page takes nothing else from the server.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from verispec.core.rules import describe
from verispec.defaults import VERIFIERS

__all__ = ["FORM_EXCLUDED", "PAGE_MAX_TOKENS", "PAGE_UNSET", "STATIC_FILES", "form_spec", "page_html", "static_file"]

#: the files under ``static/`` the server serves, with their media types
STATIC_FILES = {"page.js": "text/javascript; charset=utf-8", "page.css": "text/css; charset=utf-8"}
#: request fields the page does not show as sampling inputs: the prompt and model, what the page sets itself
#: (stream, usage, the details), what it has its own controls for (verification, speculative), aliases and
#: fields that take objects or shape the response rather than the sampling
FORM_EXCLUDED = frozenset({
    "model", "messages", "prompt", "stream", "stream_options", "verification", "speculative", "n", "logprobs",
    "top_logprobs", "max_completion_tokens", "echo", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "logit_bias",
})
#: the page's initial max_tokens (a demo answers in seconds); the field itself comes from the schema
PAGE_MAX_TOKENS = 96
#: sampling fields the page leaves empty whatever their schema default: the server's own default differs (``seed``:
#: a fresh one per request, where the schema's 0 is the command line's), and a filled field would send it every time
PAGE_UNSET = frozenset({"seed"})
#: the page's initial prompt
PAGE_PROMPT = "Write a Python function that checks whether a number is prime."


def static_file(name: str) -> tuple[bytes, str] | None:
    """(content, media type) of a file of ``static/``, or None for a name that is not one of them."""
    if name not in STATIC_FILES:
        return None
    return resources.files(__package__).joinpath("static", name).read_bytes(), STATIC_FILES[name]


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return components[ref.rsplit("/", 1)[-1]] if ref else schema


def _scalar(prop: dict[str, Any]) -> dict[str, Any] | None:
    """A property's non-null branch when it is one scalar (number, integer, string, boolean) or a string-or-list
    (``stop``); None otherwise."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    kinds = {b.get("type") for b in branches}
    if len(branches) == 1 and kinds <= {"number", "integer", "string", "boolean"}:
        return branches[0]
    if kinds == {"string", "array"}:
        return {"type": "string", "list": True}
    return None


def _range(field: dict[str, Any]) -> str:
    lo = field.get("minimum", field.get("exclusiveMinimum"))
    hi = field.get("maximum", field.get("exclusiveMaximum"))
    if lo is None and hi is None:
        return ""
    left = "(" if "exclusiveMinimum" in field else "["
    right = ")" if "exclusiveMaximum" in field else "]"
    return f"{left}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}{right}"


def form_spec(openapi: dict[str, Any], backends: dict[str, str | None] | None = None) -> dict[str, Any]:
    """What the page's form shows, read from the server's OpenAPI document and the rule registry: ``sampling``
    (the chat request's scalar fields but :data:`FORM_EXCLUDED`, each with type, default, range and description),
    ``rules`` (:func:`~verispec.core.rules.describe`), ``verifiers``, ``gamma`` (its schema) and ``backends``."""
    components = openapi["components"]["schemas"]
    chat = components["ChatCompletionRequest"]["properties"]
    sampling = []
    for name, prop in chat.items():
        if name in FORM_EXCLUDED:
            continue
        field = _scalar(prop)
        if field is None:
            continue
        sampling.append({"name": name, "type": field["type"], "list": field.get("list", False),
                         "default": prop.get("default", field.get("default")), "range": _range(field),
                         "description": prop.get("description") or field.get("description") or "",
                         "minimum": field.get("minimum", field.get("exclusiveMinimum")),
                         "maximum": field.get("maximum", field.get("exclusiveMaximum"))})
    verification = _resolve(next(b for b in chat["verification"].get("anyOf", [chat["verification"]])
                                 if b.get("type") != "null"), components)
    verifier = _scalar(verification["properties"]["verifier"]) or {}
    speculative = _resolve(next(b for b in chat["speculative"].get("anyOf", [chat["speculative"]])
                                if b.get("type") != "null"), components)
    gamma = speculative["properties"]["gamma"]
    return {
        "sampling": sampling,
        "rules": describe(),
        "verifiers": list(verifier.get("enum") or VERIFIERS),
        "verifier_default": verification["properties"]["verifier"].get("default", "token"),
        "verifier_help": {name: getattr(v, "help", v) for name, v in VERIFIERS.items()},
        "gamma": {"description": gamma.get("description", ""),
                  "integer": next((b for b in gamma.get("anyOf", []) if b.get("type") == "integer"), {})},
        "backends": backends or {},
    }


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _rule_block(spec: dict[str, Any], which: str, selected: str) -> str:
    """The rule selector of one side (``which``: "a" or "b") and a fieldset of parameters per rule."""
    rules = spec["rules"]
    opts = "".join(f'<option value="{_e(n)}"{" selected" if n == selected else ""}>{_e(n)}'
                   f'{" (lossless)" if r["lossless"] else ""}</option>' for n, r in rules.items())
    out = [f'<label for="rule-{which}">Rule</label><select id="rule-{which}" name="rule-{which}" '
           f'data-rule-select="{which}">{opts}</select>']
    for name, rule in rules.items():
        fields = []
        for pname, p in rule["params"].items():
            pid = f"param-{which}-{name}-{pname}"
            default = "" if p["default"] is None else p["default"]
            if p.get("enum"):
                choices = "".join(f'<option{" selected" if c == default else ""}>{_e(c)}</option>' for c in p["enum"])
                control = f'<select id="{pid}" data-param="{_e(pname)}">{choices}</select>'
                hint = "one of " + ", ".join(p["enum"])
            else:
                hint = _range(p) + (" or empty" if p.get("nullable") else "")
                control = (f'<input id="{pid}" type="text" inputmode="decimal" data-param="{_e(pname)}" '
                           f'data-type="number" value="{_e(default)}" size="8">')
            fields.append(f'<div class="field"><label for="{pid}">{_e(pname)} <span class="range">{_e(hint)}'
                          f'</span></label>{control}</div>')
        body = "".join(fields) or '<p class="note">no parameters</p>'
        hidden = "" if name == selected else " hidden"
        out.append(f'<fieldset class="params" data-rule="{_e(name)}" data-side="{which}"{hidden}>'
                   f'<legend>{_e(name)} parameters</legend><p class="doc">{_e(rule["doc"])}</p>{body}</fieldset>')
    return "".join(out)


def _sampling_inputs(spec: dict[str, Any]) -> str:
    out = []
    for f in spec["sampling"]:
        name, fid = f["name"], f"f-{f['name']}"
        value = PAGE_MAX_TOKENS if name == "max_tokens" else None if name in PAGE_UNSET else f["default"]
        value = "" if value is None else value
        hint = f["range"] or ("string or list" if f["list"] else f["type"])
        if f["type"] == "boolean":
            control = f'<input id="{fid}" type="checkbox" data-field="{_e(name)}" data-type="boolean"' \
                      f'{" checked" if value is True else ""}>'
        else:
            control = (f'<input id="{fid}" type="text" data-field="{_e(name)}" data-type="{_e(f["type"])}" '
                       f'value="{_e(value)}" placeholder="server default" size="10"'
                       f'{" inputmode=decimal" if f["type"] in ("number", "integer") else ""}>')
        out.append(f'<div class="field" title="{_e(f["description"])}"><label for="{fid}">{_e(name)} '
                   f'<span class="range">{_e(hint)}</span></label>{control}</div>')
    return "".join(out)


def page_html(openapi: dict[str, Any], model_name: str, backends: dict[str, str | None] | None = None) -> str:
    """The page's HTML: every control rendered here (see the module docstring), the form's description embedded
    as JSON for the script."""
    spec = form_spec(openapi, backends)
    verifiers = "".join(f'<option value="{_e(v)}" title="{_e(spec["verifier_help"].get(v, ""))}"'
                        f'{" selected" if v == spec["verifier_default"] else ""}>{_e(v)}</option>'
                        for v in spec["verifiers"])
    gamma_max = spec["gamma"]["integer"].get("maximum")
    gamma_hint = f"0-{gamma_max} or auto" if gamma_max is not None else "integer or auto"
    b = spec["backends"]
    drafter = f'{b.get("drafter") or "none"} (draft: {b.get("draft_backend") or "-"}; target: ' \
              f'{b.get("target_backend") or "-"})'
    data = json.dumps({"spec": spec, "model": model_name}).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>verispec: verification at work</title><link rel="stylesheet" href="/static/page.css"></head>
<body>
<header><h1>verispec</h1><p>Speculative decoding on <b>{_e(model_name)}</b>: each token marked by how verification
emitted it. Everything here goes through this server's OpenAI API (<code>/v1/chat/completions</code>,
<code>/v1/completions</code>).</p></header>
<main>
<form id="form" novalidate autocomplete="off">
<section class="prompt">
<fieldset class="mode"><legend>Endpoint</legend>
<label><input type="radio" name="mode" value="chat" checked> chat</label>
<label><input type="radio" name="mode" value="completion"> completion</label></fieldset>
<label for="prompt">Prompt</label>
<textarea id="prompt" name="prompt" rows="4">{_e(PAGE_PROMPT)}</textarea>
</section>
<section class="controls">
<div class="rule-side" id="side-a"><h2>Verification</h2>{_rule_block(spec, "a", "lossless")}</div>
<div class="field"><label for="verifier">Verifier</label>
<select id="verifier" name="verifier">{verifiers}</select></div>
<div class="field"><label for="gamma">gamma (draft length) <span class="range">{_e(gamma_hint)}</span></label>
<input id="gamma" name="gamma" type="text" value="auto" size="6"></div>
<div class="field"><label for="drafter">Drafter</label><output id="drafter">{_e(drafter)}</output>
<span class="note">chosen when the server starts (<code>verispec serve --drafter</code>)</span></div>
<h2>Sampling</h2><div class="sampling">{_sampling_inputs(spec)}</div>
<div class="field compare"><label><input type="checkbox" id="compare" name="compare"> Side by side: the same prompt
and seed under a second rule</label></div>
<div class="rule-side" id="side-b" hidden><h2>Second rule</h2>{_rule_block(spec, "b", "lenience")}</div>
<button id="generate" type="submit">Generate</button> <button id="stop" type="button" disabled>Stop</button>
</section>
</form>
<section class="output" aria-live="polite">
<div id="error" class="error" role="alert" hidden></div>
<ul class="legend" aria-label="legend">
<li><span class="tok mark-accepted">accepted</span> drafted token the rule kept</li>
<li><span class="tok mark-correction">correction</span> drawn from the correction r where a draft was rejected</li>
<li><span class="tok mark-bonus">bonus</span> drawn from the target after every draft was kept, or in a round
that drafted nothing</li></ul>
<div id="runs"></div>
<div id="detail" class="detail" hidden></div>
</section>
</main>
<script id="page-data" type="application/json">{data}</script>
<script src="/static/page.js"></script>
</body></html>
"""
