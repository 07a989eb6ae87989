"""The server under generated requests (schemathesis, from the server's own OpenAPI document): bodies that fit the
request schemas and bodies that break them, on both generation endpoints, against the toy engine on 127.0.0.1.
No response may be a 5xx, every error body names its problem in the OpenAI shape, and the server stays healthy.

A short, seeded version (``EXAMPLES`` per endpoint and mode); the long run is ``benchmarks/fuzz_server.py``."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from verispec.server import Limits, create_app  # noqa: E402
from verispec.server.background import BackgroundServer  # noqa: E402
from verispec.server.fuzz import fuzz  # noqa: E402
from verispec.testing import toy_engine  # noqa: E402

EXAMPLES = 60  # per endpoint and mode (positive: within the schema; negative: outside it)


@pytest.fixture(scope="module")
def server():
    app = create_app(toy_engine("model", cache=False), model_name="toy", max_batch=4, max_concurrency=64,
                     limits=Limits(max_prompt_tokens=200, max_tokens_limit=64))
    with BackgroundServer(app) as srv:
        yield srv


def test_generated_requests_get_no_server_error(server):
    report = fuzz(server.url, examples=EXAMPLES, seed=0)
    assert report["requests"] >= 4 * EXAMPLES * 0.5, report  # hypothesis may stop early on a small space
    assert report["server_errors"] == [], report["server_errors"][:3]
    assert report["bad_error_bodies"] == [], report["bad_error_bodies"][:3]
    assert report["by_status"].get("200", 0) > 0 and report["by_status"].get("400", 0) > 0, report["by_status"]
    assert report["healthy_after"]
