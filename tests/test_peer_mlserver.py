"""MLServer, a second and independent Open Inference Protocol (v2) server, answers as the OIP says.

These tests pin down the peer that latencylab's load generator is shown against: they start the real
MLServer from its own venv (``bash benchmarks/peers/mlserver_setup.sh``) and talk to it with plain
urllib over loopback. Without that venv they are skipped loudly; under CI (``CI`` set) its absence is
a failure, because CI must have run the setup script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer_servers import MLSERVER_MODELS, MLSERVER_SETUP, PeerServer, http_status, mlserver_available, start_mlserver

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SLEEPY_SERVICE_MS = float(
    json.loads((MLSERVER_MODELS / "sleepy" / "model-settings.json").read_text())["parameters"]["extra"]["service_ms"]
)
INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def _require_mlserver() -> None:
    if mlserver_available():
        return
    reason = f"MLSERVER PEER NOT SET UP: the OIP interoperability tests did not run; run `{MLSERVER_SETUP}` first"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so .ci/run must have done it)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def mlserver() -> Iterator[PeerServer]:
    _require_mlserver()
    with start_mlserver(timeout_s=60) as peer:
        yield peer


def _request(
    url: str, body: dict[str, Any] | None = None, timeout_s: float = 10.0
) -> tuple[int, dict[str, str], Any, float]:
    """(status, headers, parsed JSON body, seconds) for GET url, or POST body as JSON."""
    data = None if body is None else json.dumps(body).encode()
    # MLServer answers 422 to a JSON body sent without this header (urllib's default is form-encoded).
    headers = {} if body is None else {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers)
    t0 = time.perf_counter()
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            status, hdrs, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    elapsed = time.perf_counter() - t0
    return status, {k.lower(): v for k, v in hdrs.items()}, json.loads(raw), elapsed


def test_server_is_live_ready_and_describes_itself(mlserver: PeerServer) -> None:
    assert mlserver.url.startswith("http://127.0.0.1:")
    assert http_status(mlserver.url + "/v2/health/live") == 200
    assert http_status(mlserver.url + "/v2/health/ready") == 200
    status, _, meta, _ = _request(mlserver.url + "/v2")
    assert status == 200
    assert meta["name"] == "mlserver"
    assert meta["version"].startswith("1.7.")


def test_model_metadata(mlserver: PeerServer) -> None:
    assert http_status(mlserver.url + "/v2/models/sleepy/ready") == 200
    status, headers, meta, _ = _request(mlserver.url + "/v2/models/sleepy")
    assert status == 200
    assert headers["content-type"].startswith("application/json")
    assert meta["name"] == "sleepy"
    assert meta["platform"] == "latencylab-peer"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]


def test_infer_echoes_fp32_and_takes_at_least_the_service_time(mlserver: PeerServer) -> None:
    latencies = []
    for _ in range(5):
        status, headers, resp, elapsed = _request(mlserver.url + "/v2/models/sleepy/infer", INFER_BODY)
        assert status == 200, resp
        latencies.append(elapsed)
    assert headers["content-type"].startswith("application/json")
    assert resp["model_name"] == "sleepy"
    assert isinstance(resp["id"], str) and resp["id"]  # the server makes one up when the request has none
    assert len(resp["outputs"]) == 1
    out = resp["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"]) == ("OUTPUT0", "FP32", [1, 4])
    assert out["data"] == [1.0, 2.0, 3.0, 4.0]
    # Every request slept service_ms on the server; no client-side timing can make it shorter.
    assert min(latencies) * 1e3 >= SLEEPY_SERVICE_MS, latencies


def test_infer_bytes_and_request_id_round_trip(mlserver: PeerServer) -> None:
    body = {
        "id": "req-42",
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [3], "data": ["abc", "", "héllo"]}],
    }
    status, _, resp, _ = _request(mlserver.url + "/v2/models/echo/infer", body)
    assert status == 200, resp
    assert resp["id"] == "req-42"
    assert resp["model_name"] == "echo"
    out = resp["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"], out["data"]) == ("OUTPUT0", "INT64", [3], [3, 0, 6])


def test_bad_input_is_a_400_with_a_json_error(mlserver: PeerServer) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    status, _, resp, _ = _request(mlserver.url + "/v2/models/echo/infer", body)
    assert status == 400
    assert "FP32 or BYTES" in resp["error"]


def test_unknown_model_is_a_404_with_a_json_error(mlserver: PeerServer) -> None:
    status, headers, resp, _ = _request(mlserver.url + "/v2/models/no-such-model/infer", INFER_BODY)
    assert status == 404
    assert headers["content-type"].startswith("application/json")
    assert resp == {"error": "Model no-such-model not found"}
    status, _, resp, _ = _request(mlserver.url + "/v2/models/no-such-model")
    assert status == 404
    assert "not found" in resp["error"]


def test_a_second_peer_gets_its_own_ports_and_stop_reaps_it(mlserver: PeerServer) -> None:
    with start_mlserver(timeout_s=60) as second:
        assert second.url != mlserver.url
        assert not set(second.ports.values()) & set(mlserver.ports.values())
        assert http_status(second.url + "/v2/health/ready") == 200
        assert second.startup_s is not None and second.startup_s > 0
    assert second.process.returncode is not None  # reaped
    assert http_status(second.url + "/v2/health/live", timeout_s=0.5) is None
    assert not second.workdir.exists()
    assert http_status(mlserver.url + "/v2/health/ready") == 200  # the first one is untouched


def _load_cli(*args: str, tmp: Path) -> dict[str, Any]:
    out = tmp / "load.json"
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    summary: dict[str, Any] = json.loads(out.read_text())["summary"]
    return summary


def test_latencylab_load_drives_mlserver_unchanged(mlserver: PeerServer, tmp_path: Path) -> None:
    """Interop: the same generator, open and closed loop, against a second OIP implementation."""
    s = _load_cli("--url", mlserver.url, "--model", "sleepy", "--rate", "40", "--duration", "3", tmp=tmp_path)
    assert s["sent"] == s["ok"] > 80 and s["error"] == s["shed"] == 0
    # a busy CI machine can delay a few sends of this short run (the generator then marks the run invalid
    # and says so); that is the generator's honesty, not an interop failure: any other reason is one
    assert s["valid"] or all("fell behind" in r for r in s["invalid_reasons"]), s["invalid_reasons"]
    assert s["p50_ms"] >= SLEEPY_SERVICE_MS  # the model sleeps service_ms per request
    closed = _load_cli("--url", mlserver.url, "--model", "sleepy", "--concurrency", "2", "--max-requests", "100",
                       tmp=tmp_path)  # fmt: skip
    assert closed["sent"] == closed["ok"] == 100
    assert closed["mode"] == "closed (concurrency 2)"
    # BYTES payloads from the text corpus (real varied lengths) go through the same path
    text = _load_cli("--url", mlserver.url, "--model", "sleepy", "--payload", "text", "--input-name", "INPUT0",
                     "--rate", "20", "--duration", "2", tmp=tmp_path)  # fmt: skip
    assert text["sent"] == text["ok"] > 20


def test_latencylab_load_reports_unknown_model_on_mlserver(mlserver: PeerServer) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", "--url", mlserver.url, "--model", "nosuch", "--rate", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"latencylab load: error: the server at {mlserver.url} does not know model 'nosuch' (404 on /v2/models/nosuch)"
    ]
