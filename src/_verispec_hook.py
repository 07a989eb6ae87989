"""Makes ``lm_eval --model verispec`` work with the stock ``lm_eval`` command.

lm-evaluation-harness (0.4.x) has no plug-in entry points: its registry knows its own models and those of modules
already imported. verispec's ``verispec-hook.pth`` imports this module at interpreter start; it puts one finder on
``sys.meta_path`` that imports nothing and, the moment ``lm_eval.models`` has loaded (lm-eval imports it when its
registry is first asked for a model, and fills the registry with its own), registers the name "verispec" in the
model registry as a lazy entry (``verispec.integrations.lmeval:VerispecLM``, imported only when a run asks for
it). A failure never breaks the import of lm-eval: it becomes a warning.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

_MODELS = "lm_eval.models"
_TARGET = "verispec.integrations.lmeval:VerispecLM"


def register() -> None:
    """Register "verispec" in lm-eval's model registry (a no-op where the name is taken)."""
    registry = sys.modules["lm_eval.api.registry"].model_registry
    if "verispec" not in registry:
        registry.register("verispec", target=_TARGET)


class _Loader(importlib.abc.Loader):
    """lm-eval's own loader for its models module, then :func:`register`; everything else is delegated."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self._inner.exec_module(module)
        try:
            register()
        except Exception as exc:  # an lm-eval whose registry changed: its import must still work
            warnings.warn(f"verispec could not register its lm-eval model: {exc!r}", stacklevel=2)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for lm-eval's models module it asks the finders after it and wraps the loader."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname != _MODELS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (or register at once where lm-eval's models are loaded)."""
    if _MODELS in sys.modules:
        register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
