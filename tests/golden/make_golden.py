"""Write the golden results that tests/test_golden.py compares against: a toy sweep (configs/toy.toml) and a short
sweep on the real pair (fp32, two HumanEval problems, lossless and lenience). Run it only when a change is MEANT to
change tokens, and say so in the commit:  python3 tests/golden/make_golden.py [toy|real]"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: the fields of a result line that a refactor must not change (timings and timestamps are left out)
FIELDS = ("key", "label", "baseline", "seed", "gen_seed", "settings", "prompt_tokens", "text", "token_ids",
          "finish_reason", "grade", "be", "rounds", "drafted", "accepted", "emitted_accepted", "per_round",
          "per_round_emitted")
REAL_CONFIG = """
name = "golden_real"
seeds = [0]
temperature = 0.7
gamma = 4
max_new_tokens = 32
[models]
target = "qwen2.5-coder-1.5b-instruct"
draft = "qwen2.5-coder-0.5b-instruct"
drafter = "model"
dtype = "float32"
[[tasks]]
name = "humaneval"
limit = 2
[[methods]]
rule = "lossless"
[[methods]]
rule = "lenience"
params = { l = 0.5 }
"""


def cpu_kind() -> str:
    """The CPU's model name and its widest vector extension: fp32 matrix products round differently across CPU
    kinds, so the real-pair golden is compared only on the kind it was recorded on."""
    model, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    isa = "amx" if " amx_tile" in flags else "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else "x86"
    return f"{model} / {isa}"


def project(records: list[dict]) -> list[dict]:
    """The refactor-invariant part of each result line, sorted by key."""
    return [{k: r[k] for k in FIELDS} for r in sorted(records, key=lambda r: r["key"])]


def run(config_text: str | None, engine_factory=None) -> list[dict]:
    """Run a sweep (``None``: configs/toy.toml) in a scratch directory and return its projected results."""
    import tomllib

    from verispec.eval.grid import load_config, parse_config
    from verispec.eval.run import run_sweep
    from verispec.eval.store import read_results

    cfg = load_config(ROOT / "configs" / "toy.toml") if config_text is None else parse_config(
        tomllib.loads(config_text))
    with tempfile.TemporaryDirectory() as d:
        run_sweep(cfg, d, progress=False, engine_factory=engine_factory)
        return project(read_results(d))


def main(which: str = "both") -> None:
    if which in ("toy", "both"):
        (HERE / "toy_sweep.json").write_text(json.dumps(run(None), indent=1) + "\n")
    if which in ("real", "both"):
        (HERE / "real_pair.json").write_text(json.dumps({"cpu": cpu_kind(), "results": run(REAL_CONFIG)}, indent=1)
                                             + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
