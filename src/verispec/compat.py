"""The versions of the libraries verispec reaches into, in one place (pyproject.toml's pins say the same; a test
ties them), and the check that refuses an unsupported one with one message naming the range."""

from __future__ import annotations

from importlib import metadata

#: (inclusive lower, exclusive upper bound) per distribution, as tested: transformers 4.57.6 and 5.19.0 (vLLM 0.32
#: needs 5.16.1-5.19); vLLM 0.32 (the plug-in patches its sampler internals); lm-eval 0.4.13 (its model registry)
SUPPORTED: dict[str, tuple[str, str]] = {
    "transformers": ("4.57.6", "5.20"),
    "vllm": ("0.32.0", "0.33.0"),
    "lm-eval": ("0.4.13", "0.5"),
}


def version_tuple(v: str) -> tuple[int, ...]:
    """The release numbers of a version string ("5.19.0+cpu" -> (5, 19, 0)), for range comparisons."""
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def spec(name: str) -> str:
    """The supported range as a pip requirement, e.g. ``transformers>=4.57.6,<5.20``."""
    lo, hi = SUPPORTED[name]
    return f"{name}>={lo},<{hi}"


def check(name: str, version: str | None = None) -> None:
    """ImportError naming the supported range unless ``name``'s installed ``version`` (read from its metadata
    when not given) lies in it; a distribution that is not installed passes (its import fails on its own)."""
    if version is None:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            return
    lo, hi = SUPPORTED[name]
    if not version_tuple(lo) <= version_tuple(version) < version_tuple(hi):
        raise ImportError(f"verispec supports {name} >= {lo}, < {hi}; this environment has {name} {version} "
                          f"(pip install '{spec(name)}')")
