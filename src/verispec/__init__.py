"""verispec: speculative decoding whose verification can be trusted and measured.

The heavy parts (torch models, transformers) load on first use of ``generate`` / ``load_engine`` and friends,
so ``import verispec.core.rules`` or ``verispec.eval`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from verispec import compat as _compat

# one clear error now rather than an obscure one at the first model load (the supported range: verispec.compat)
_compat.check("transformers")

__all__ = [
    "Engine",
    "GenerationResult",
    "Metrics",
    "Request",
    "SamplingConfig",
    "Scheduler",
    "SpeculativeEngine",
    "audit",
    "generate",
    "load_engine",
    "rules",
]
__version__ = "0.1.0"

_LAZY = {
    "generate": "api",
    "load_engine": "api",
    "GenerationResult": "runtime.types",
    "Metrics": "runtime.types",
    "SpeculativeEngine": "runtime.engine",
    "Engine": "runtime.engine",
    "Request": "runtime.types",
    "Scheduler": "runtime.scheduler",
    "SamplingConfig": "core.sampling",
}


def __getattr__(name: str) -> Any:
    if name == "rules":
        return importlib.import_module(".core.rules", __name__)
    if name == "audit":  # the package, callable: verispec.audit(base_url, model, ...) runs verispec.audit.audit
        return importlib.import_module(".audit", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")
