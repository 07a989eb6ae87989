"""The engine under test, reached only through its OpenAI-compatible HTTP API (``/v1/completions``).

Every failure becomes an :class:`AuditInputError` that names what is missing (the endpoint, a refused field, a
malformed answer) and what would work instead; the audit stops there and reaches no verdict.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

from verispec.options import OPTIONS

__all__ = ["AuditInputError", "EngineClient"]

#: retries of a request answered 429 / 503 (the engine busy), with waits doubling from 0.25 s up to 5 s
RETRIES = 12

#: what each field is needed for, and what to do when an engine refuses it
FIELD_ADVICE = {
    "seed": "distinct seeds make the samples independent and the audit reproducible; an engine that refuses "
            "`seed` cannot be audited reproducibly (no reference mode replaces it)",
    "top_k": "top_k keeps the continuations' support small enough to enumerate; with an engine without top_k, "
             "audit with --top-k 0 and a --top-p or --min-p the engine honours",
    "logprobs": "--reference-url reads the reference law from the endpoint's top logprobs; without them, give "
                "--reference-model (the same weights as a GGUF or HF directory) instead, or add --two-sample "
                "(the endpoint sampled like the engine: approximate)",
    "n": "several choices per request only save requests; the audit falls back to one choice per request",
}


#: the request fields the audit may send, in the order a refusal's message is searched for them: the server's own,
#: then the request schema's top-level ones
_FIELDS = ("seed", "logprobs", "n", *(o.field for o in OPTIONS.values() if o.field and "." not in o.field),
           "verification", "speculative")


class AuditInputError(RuntimeError):
    """The audit cannot go on: an endpoint down, a needed field refused, a malformed answer, a bad setting. No
    verdict is reached on partial data (exit status 3)."""


def _advice(field: str | None) -> str:
    return f" ({FIELD_ADVICE[field]})" if field in FIELD_ADVICE else ""


class EngineClient:
    """POSTs completion requests to ``base_url`` (``http://HOST:PORT`` or ``.../v1``) for ``model``."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                 extra_body: dict | None = None, role: str = "engine") -> None:
        base = base_url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.model, self.api_key, self.timeout = model, api_key, timeout
        self.extra_body = dict(extra_body or {})
        self.role = role

    def complete(self, prompt: str, **fields: Any) -> dict:
        """One ``/v1/completions`` request; the parsed JSON answer, or :class:`AuditInputError`."""
        body = {"model": self.model, "prompt": prompt, **self.extra_body, **fields}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base + "/completions", data=json.dumps(body).encode(), headers=headers)
        raw = b""
        for attempt in range(RETRIES + 1):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as err:
                if err.code in (429, 503) and attempt < RETRIES:  # busy, not a refusal: wait and retry
                    try:
                        err.read()
                    except (OSError, http.client.HTTPException):
                        pass  # the body of a busy answer says nothing the retry needs
                    time.sleep(min(0.25 * 2**attempt, 5.0))
                    continue
                raise self._refused(err, body) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
                reason = getattr(err, "reason", err)
                raise AuditInputError(f"the {self.role} endpoint {self.base} is not answering ({reason}): start it, "
                                      f"or check {self._flag}") from None
            except http.client.HTTPException as err:  # something answers, but not in HTTP (or cut mid-answer)
                raise AuditInputError(f"the {self.role} endpoint {self.base} gave no valid HTTP answer "
                                      f"({repr(err)[:120]}): is it an OpenAI-compatible HTTP "
                                      f"server? check {self._flag}") from None
        try:
            out = json.loads(raw)
        except ValueError:
            raise AuditInputError(f"the {self.role} endpoint {self.base}/completions answered with malformed JSON "
                                  f"({raw[:80]!r}...): is it an OpenAI-compatible server?") from None
        if not isinstance(out, dict) or not isinstance(out.get("choices"), list) or not out["choices"]:
            raise AuditInputError(f"the {self.role} endpoint's answer has no `choices` list "
                                  f"({str(out)[:120]}): not an OpenAI completion")
        for ch in out["choices"]:
            if not isinstance(ch, dict) or not isinstance(ch.get("text"), str):
                raise AuditInputError(f"the {self.role} endpoint's answer has a choice without `text` "
                                      f"({str(ch)[:120]})")
        return out

    @property
    def _flag(self) -> str:
        return "--base-url" if self.role == "engine" else "--reference-url"

    def _refused(self, err: urllib.error.HTTPError, body: dict) -> AuditInputError:
        try:
            detail = json.loads(err.read())
        except (ValueError, OSError, http.client.HTTPException):
            detail = {}
        error = detail.get("error") if isinstance(detail, dict) else None
        message = (error or {}).get("message") if isinstance(error, dict) else None
        param = (error or {}).get("param") if isinstance(error, dict) else None
        message = message or (str(detail)[:200] if detail else err.reason)
        if err.code in (401, 403):
            return AuditInputError(f"the {self.role} endpoint refused the request ({err.code}): give --api-key")
        if err.code == 404:
            return AuditInputError(f"the {self.role} endpoint answered 404 ({message}): check --model "
                                   f"{self.model!r} and the URL {self.base}")
        if err.code >= 500:  # the engine failed on a request it accepted: a defect to report, not a refused field
            return AuditInputError(f"the {self.role} endpoint failed on a valid request ({err.code}: {message}); "
                                   f"the request was {json.dumps(body)[:300]}")
        # a field is named where the error names it as a word ("n" must not match every message's letters)
        field = param if param in body else next((f for f in _FIELDS if f in body
                                                  and re.search(rf"\b{re.escape(f)}\b", str(message))), param)
        named = f"field `{field}`" if field else "the request"
        return AuditInputError(f"the {self.role} endpoint refused {named} ({err.code}: {message}){_advice(field)}")
