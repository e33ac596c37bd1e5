"""Refusal before decoding (serve/early.py): a request admission would shed is answered 503 from its headers,
and its body is never decoded; a request whose body may state its own deadline is decoded and judged in full.

The server runs on a FakeClock with a variant whose batch costs 50 ms of that clock: with a 30-ms deadline every
request is predicted late and shed, with a 1-s deadline every request is admitted. A body that is not JSON is the
witness: decoded, it is a 400; refused before decoding, a 503.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from fake_variants import admission_state
from latencylab.clock import FakeClock
from latencylab.serve.app import lifespan_app
from latencylab.serve.early import body_may_state_deadline

URL = "/v2/models/fake/infer"
GOOD = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
NOT_JSON = b"{this is not JSON"
LONG = {"x-latencylab-deadline-ms": "1000"}


@pytest.fixture
def client() -> Iterator[tuple[TestClient, dict[str, float]]]:
    state = admission_state(FakeClock())
    with TestClient(lifespan_app(state)) as c:
        yield c, _counts(c)


def _counts(c: TestClient) -> dict[str, float]:
    """Every counter sample of the server's /metrics, by its exposition line's name and labels."""
    out: dict[str, float] = {}
    for line in c.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


SHED = 'latencylab_server_shed_total{model="fake",reason="deadline"}'
BAD_INPUT = 'latencylab_server_errors_total{kind="bad_input",model="fake"}'


def _delta(c: TestClient, before: dict[str, float], name: str) -> float:
    return _counts(c).get(name, 0.0) - before.get(name, 0.0)


def test_a_request_predicted_late_is_refused_before_its_body_is_decoded(client: tuple[TestClient, dict]) -> None:
    c, before = client
    r = c.post(URL, content=NOT_JSON)
    assert r.status_code == 503, r.text  # decoded, this body is a 400 (below): it never was
    assert r.json()["error"].startswith("overloaded (deadline)")
    assert int(r.headers["Retry-After"]) >= 1
    assert _delta(c, before, SHED) == 1 and _delta(c, before, BAD_INPUT) == 0
    # with a deadline the batch fits in, the same body is decoded, and refused for what it is
    r = c.post(URL, content=NOT_JSON, headers=LONG)
    assert r.status_code == 400 and "JSON" in r.json()["error"], r.text
    assert _delta(c, before, BAD_INPUT) == 1
    assert c.post(URL, json=GOOD, headers=LONG).status_code == 200


def test_a_body_that_may_state_a_longer_deadline_is_decoded_and_judged_by_it(client: tuple[TestClient, dict]) -> None:
    c, _ = client
    # the body's deadline_ms (1 s) wins over the default (30 ms): refusing on the default would be wrong
    r = c.post(URL, json={**GOOD, "parameters": {"deadline_ms": 1000}})
    assert r.status_code == 200, r.text
    # ... and one it states with a \u escape is recognised too
    escaped = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}], '
    escaped += b'"parameters": {"deadline\\u005fms": 1000}}'
    assert c.post(URL, content=escaped).status_code == 200
    # a body stating a short one is decoded, then shed by the full admission
    r = c.post(URL, json={**GOOD, "parameters": {"deadline_ms": 30}}, headers=LONG)
    assert r.status_code == 503 and r.json()["error"] == "overloaded (deadline)"


def test_a_request_aged_past_its_deadline_is_refused_before_decoding(client: tuple[TestClient, dict]) -> None:
    c, before = client
    stamp = f"t={time.time() - 5.0:.6f}"  # started 5 s ago: a 1-s deadline is long gone
    r = c.post(URL, content=NOT_JSON, headers={**LONG, "X-Request-Start": stamp})
    assert r.status_code == 503 and "old on arrival" in r.json()["error"], r.text
    assert _delta(c, before, BAD_INPUT) == 0


def test_every_request_has_exactly_one_outcome_and_the_server_counts_it(client: tuple[TestClient, dict]) -> None:
    """sent = ok + shed + error, from the client's side and the server's counters, over a mix of refusals before
    decoding, full admissions, bad bodies and answers."""
    c, before = client
    sends = [(NOT_JSON, {}), (NOT_JSON, LONG), (None, LONG), (None, {}), (b"[]", LONG), (b"[]", {})] * 5
    codes = []
    for body, headers in sends:
        r = c.post(URL, json=GOOD, headers=headers) if body is None else c.post(URL, content=body, headers=headers)
        codes.append(r.status_code)
    ok, shed, error = codes.count(200), codes.count(503), sum(1 for x in codes if x not in (200, 503))
    assert (ok, shed, error) == (5, 15, 10)
    assert len(sends) == ok + shed + error
    assert _delta(c, before, SHED) == shed
    assert _delta(c, before, 'latencylab_server_requests_total{code="200",model="fake",producer="fp32"}') == ok
    assert _delta(c, before, BAD_INPUT) == error


def test_the_deadline_markers_are_looked_for_in_the_json_part_only() -> None:
    assert body_may_state_deadline(b'{"parameters": {"deadline_ms": 5}}', {})
    assert body_may_state_deadline(b'{"a": "\\u0041"}', {})
    assert not body_may_state_deadline(b'{"inputs": []}', {})
    binary = b'{"inputs": []}' + b"deadline_ms\\u"  # tensor bytes may hold anything
    assert not body_may_state_deadline(binary, {"inference-header-content-length": "14"})
    assert body_may_state_deadline(binary, {})
