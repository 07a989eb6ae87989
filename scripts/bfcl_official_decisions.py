"""Record bfcl-eval's own accept/reject decisions on the BFCL agreement cases.

    python3 scripts/bfcl_official_decisions.py                  # bfcl-eval installed WITH its deps
    python3 scripts/bfcl_official_decisions.py --stub-heavy-imports   # bfcl-eval installed --no-deps

Writes ``tests/eval/data/bfcl_official_decisions.json`` (one line per problem: the hash of its
case list and one 0/1 per case), which ``tests/eval/test_task_bfcl.py`` compares verispec's
checker against on every run, and prints per-kind agreement counts (docs/results/bfcl_checker.md).

The official decision is BFCL's pipeline for a prompting model: ``default_decode_ast_prompting``
(any exception: reject), ``is_function_calling_format_output``, then ``ast_checker`` with
``Language.PYTHON`` (an exception there, which would stop BFCL's own runner, counts as reject).

``--stub-heavy-imports``: bfcl-eval's modules import, at top level, things the Python AST path
never calls -- ``constants.model_config`` (every model handler: anthropic, openai, boto3,
qwen_agent ...; the checker reads it only in ``convert_func_name``, to rewrite dotted function
names for function-calling models whose ``underscore_to_dot`` is set), the Java/JavaScript
parsers (tree_sitter) and tenacity (a retry decorator). This flag registers stand-ins for those
three in ``sys.modules`` before importing (``underscore_to_dot`` False, as for every prompting
model) so the decoder and checker run from the installed --no-deps package. It is a measuring
tool only: verispec's own code never imports bfcl_eval.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "eval" / "data" / "bfcl_official_decisions.json"
sys.path.insert(0, str(ROOT / "tests" / "eval"))


def _stub_heavy_imports() -> None:
    class _Config:
        underscore_to_dot = False

    class _Mapping(dict):
        def __missing__(self, key):
            return _Config()

    def _never(*args, **kwargs):
        raise RuntimeError("stand-in: not used on BFCL's Python AST path")

    def module(name: str, **attrs) -> None:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    module("bfcl_eval.constants.model_config", MODEL_CONFIG_MAPPING=_Mapping())
    module("bfcl_eval.model_handler.parser.java_parser", parse_java_function_call=_never)
    module("bfcl_eval.model_handler.parser.js_parser", parse_javascript_function_call=_never)
    try:
        import tenacity  # noqa: F401
    except ImportError:
        module("tenacity", retry=_never, retry_if_exception_message=_never,
               retry_if_exception_type=_never, wait_random_exponential=_never)


def official_decider(model_name: str):
    """``decide(problem, text) -> bool`` running bfcl-eval's installed decoder and checker."""
    # bfcl_eval.utils creates result/, score/ and .file_locks/ under this root when imported
    os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="bfcl_root_"))
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting
    from bfcl_eval.utils import is_function_calling_format_output

    def decide(problem, text: str) -> bool:
        try:
            decoded = default_decode_ast_prompting(text)
        except Exception:
            return False
        if not is_function_calling_format_output(decoded):
            return False
        ref = problem.reference
        try:
            result = ast_checker(ref["functions"], decoded, ref["ground_truth"], Language.PYTHON,
                                 problem.meta["category"], model_name)
        except Exception:
            return False
        return bool(result["valid"])

    return decide


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stub-heavy-imports", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.stub_heavy_imports:
        _stub_heavy_imports()
    from importlib.metadata import version

    from bfcl_cases import MODEL_NAME, cases_digest, labelled_cases

    from verispec.eval.tasks.bfcl import BFCLTask

    decide = official_decider(MODEL_NAME)
    strict, lenient = BFCLTask(), BFCLTask(lenient=True)
    rows = {}
    per_kind: Counter = Counter()
    for p in strict.load():
        labelled = labelled_cases(p)
        bits = []
        for kind, text in labelled:
            off = decide(p, text)
            bits.append("1" if off else "0")
            per_kind[kind, "cases"] += 1
            per_kind[kind, "official accepts"] += off
            per_kind[kind, "verispec disagrees"] += strict.grade(p, text).passed != off
            per_kind[kind, "lenient disagrees"] += lenient.grade(p, text).passed != off
        rows[p.id] = [cases_digest([t for _, t in labelled]), "".join(bits)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        head = {"bfcl_eval": version("bfcl-eval"), "model_name": MODEL_NAME,
                "stubbed_imports": args.stub_heavy_imports}
        f.write(json.dumps(head)[:-1] + ', "entries": {\n')
        f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in rows.items()))
        f.write("\n}}\n")
    kinds = list(dict.fromkeys(k for k, _ in per_kind))
    cols = ["cases", "official accepts", "verispec disagrees", "lenient disagrees"]
    print("| kind | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for k in kinds:
        print(f"| {k} | " + " | ".join(str(per_kind[k, c]) for c in cols) + " |")
    print("| all | " + " | ".join(str(sum(per_kind[k, c] for k in kinds)) for c in cols) + " |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
