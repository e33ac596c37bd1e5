"""The server's fuzz suite: schemathesis against the Open Inference Protocol's REST routes (issue 15).

Every route of the protocol's REST specification that a server must implement (health, server and model
metadata, readiness, inference; ``tests/data/oip_rest.yaml``) gets ``EXAMPLES`` requests generated from the
spec's schemas, with the model name filled in (``fake``; versions ``fp32``, any other string: a 404), sent over
real HTTP to a real server (uvicorn with the server's own protocol and limits) serving fake variants. The suite
passes when none is answered with a 5xx and every answer is JSON-parsable where the server says it is JSON.
It runs in the slow tier (``make test``): ~9 x 300 requests.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fake_variants import FakeVariant
from latencylab.serve.app import build_state
from latencylab.serve.config import ModelConfig, ServerConfig
from servers import uvicorn_thread

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extras: pip install -e .[dev]")
hypothesis = pytest.importorskip("hypothesis")

pytestmark = pytest.mark.slow
SPEC = Path(__file__).parent / "data" / "oip_rest.yaml"
EXAMPLES = 300


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32", "cache"), factory="fake_variants:make"),))
    state = build_state(cfg, {"fake": [FakeVariant("fp32", 0.0005)]})
    with uvicorn_thread(state) as (host, port):
        yield f"http://{host}:{port}"


def _operations() -> list[Any]:
    schema = schemathesis.openapi.from_path(str(SPEC))
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", _operations(), ids=lambda op: f"{op.method.upper()} {op.path}")
def test_no_server_error_on_the_oip_routes(server: str, operation: Any) -> None:
    import requests
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    statuses: Counter[int] = Counter()
    bad: list[str] = []
    session = requests.Session()

    @given(case=operation.as_strategy(), version=st.sampled_from(["fp32", "fp32", "cache", "nope"]))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any, version: str) -> None:
        params = dict(case.path_parameters or {})
        if "model_name" in params:
            params["model_name"] = "fake"
        if "model_version" in params:
            params["model_version"] = version
        case.path_parameters = params
        response = case.call(base_url=server, session=session, timeout=30)
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            bad.append(f"{response.status_code} {case.method} {case.formatted_path}: {response.text[:200]}")
        elif "json" in response.headers.get("content-type", ""):
            json.loads(response.content)

    fuzz()
    total = sum(statuses.values())
    print(f"{operation.method.upper()} {operation.path}: {total} requests, statuses {dict(sorted(statuses.items()))}")
    # a route without parameters has a handful of distinct requests (hypothesis stops when it has tried them)
    assert total >= (EXAMPLES // 2 if "{" in operation.path else 1)
    assert not bad, bad[:5]
