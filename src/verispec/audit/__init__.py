"""Audit any engine's sampling, speculative or not, black-box through its OpenAI-compatible API: the law of short
continuations it samples against their exact reference law, with a tolerance for float noise and stated power; or,
with ``two_sample``, against a reference endpoint's own samples (approximate) (docs/audit.md)."""

from __future__ import annotations

import sys
import types
from typing import Any

from verispec.audit.client import AuditInputError, EngineClient
from verispec.audit.core import AuditReport, audit, choose_design
from verispec.audit.reference import ModelReference, UrlReference

__all__ = ["AuditInputError", "AuditReport", "EngineClient", "ModelReference", "UrlReference", "audit",
           "choose_design"]


class _CallableModule(types.ModuleType):
    """``verispec.audit(...)`` is :func:`verispec.audit.audit` while ``verispec.audit`` stays this package."""

    def __call__(self, *args: Any, **kwargs: Any) -> AuditReport:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
