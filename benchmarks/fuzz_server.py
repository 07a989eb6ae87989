"""Fuzz ``verispec serve`` from its OpenAPI document (schemathesis): thousands of generated requests, within the
request schemas and outside them, on both generation endpoints, against a server on 127.0.0.1 (the toy engine by
default: the server's handling is what is under test, not the model). Reports the count per status, every 5xx
and every error body not in the OpenAI shape, and the server's health afterwards; writes JSON.

    python benchmarks/fuzz_server.py --examples 300 --out docs/results/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from verispec.server import Limits, create_app
from verispec.server.background import BackgroundServer
from verispec.server.fuzz import fuzz
from verispec.testing import toy_engine


def main() -> None:
    app = create_app(toy_engine("model", cache=False), model_name="toy", max_batch=8, max_concurrency=64,
                     limits=Limits(max_prompt_tokens=200, max_tokens_limit=64))
    with BackgroundServer(app) as srv:
        report = fuzz(srv.url, examples=ARGS.examples, seed=ARGS.seed)
    report["config"] = vars(ARGS)
    print(json.dumps({k: v for k, v in report.items() if k not in ("server_errors", "bad_error_bodies")}, indent=1))
    print(f"server errors: {len(report['server_errors'])}, bad error bodies: {len(report['bad_error_bodies'])}",
          file=sys.stderr)
    if ARGS.out:
        os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
        with open(ARGS.out, "w") as f:
            json.dump(report, f, indent=1, default=repr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300, help="generated requests per endpoint and mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ARGS = ap.parse_args()
    main()
