"""Issue 15: hostile and unusual clients. Every refusal is a 4xx JSON error (never a 500, never plain text),
the binary tensor data extension works with tritonclient's defaults, and slow or oversized request heads and
bodies are cut off. The codec is tested directly; the app in-process (Starlette TestClient); the connection
limits and tritonclient against a real uvicorn server on loopback (a thread, with short limits).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator, MutableMapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from fake_variants import FakeVariant
from latencylab.serve.app import ServerState, build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.limits import HttpLimits
from latencylab.serve.protocol_request import (
    MAX_DEADLINE_MS,
    OutputFormat,
    decode_infer_request,
    parse_infer_request,
)
from latencylab.serve.protocol_response import encode_infer_body
from latencylab.serve.types import InferResponse, ProtocolError, Tensor, TensorSpec
from servers import uvicorn_thread
from test_serve_protocol import EXAMPLES as JSON_EXAMPLES

BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
INFER = "/v2/models/fake/infer"
HUGE_INT = "1" + "0" * 400  # parses (under Python's 4300-digit limit), overflows any float conversion
LONG_INT = "9" * 5000  # beyond Python's int-string limit: json.loads raises ValueError


def _state(max_body_bytes: int = 64 * 1024, delay_s: float = 0.001) -> ServerState:
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make"),),
        max_body_bytes=max_body_bytes,
    )
    variants: list[Any] = [FakeVariant("fp32", delay_s)]
    return build_state(cfg, {"fake": variants})


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    state = _state()
    with TestClient(lifespan_app(state), raise_server_exceptions=False) as c:
        c.state = state  # type: ignore[attr-defined]
        yield c


def _post(client: TestClient, body: bytes | str, headers: dict[str, str] | None = None) -> Any:
    content = body.encode() if isinstance(body, str) else body
    return client.post(INFER, content=content, headers={"Content-Type": "application/json", **(headers or {})})


def _json_error(r: Any, status: int) -> str:
    assert r.status_code == status, r.text[:300]
    assert r.headers["content-type"] == "application/json"
    return str(r.json()["error"])


# --- 1. deadlines ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("1e303", "more than the maximum of 3600000 ms"),
        (HUGE_INT, "more than the maximum of 3600000 ms"),
        ("3600000.5", "more than the maximum"),
        ("NaN", "must be a positive number"),
        ("Infinity", "must be a positive number"),
        ("-Infinity", "must be a positive number"),
        ("-1", "must be a positive number"),
        ("0", "must be a positive number"),
        ("1e-400", "must be a positive number"),  # underflows to 0.0
    ],
)
def test_deadline_parameter_out_of_range_is_400(client: TestClient, value: str, fragment: str) -> None:
    body = '{"parameters": {"deadline_ms": ' + value + '}, "inputs": ' + json.dumps(BODY["inputs"]) + "}"
    error = _json_error(_post(client, body), 400)
    assert "deadline_ms" in error and fragment in error


@pytest.mark.parametrize("value", ["1e303", HUGE_INT, "nan", "inf", "-inf", "-5", "0", "1_000", "0x10", "", "5 ms"])
def test_deadline_header_out_of_range_or_not_a_number_is_400(client: TestClient, value: str) -> None:
    error = _json_error(_post(client, json.dumps(BODY), {"X-Latencylab-Deadline-Ms": value}), 400)
    assert "x-latencylab-deadline-ms" in error


def test_deadline_at_the_maximum_is_served(client: TestClient) -> None:
    body = json.dumps({**BODY, "parameters": {"deadline_ms": MAX_DEADLINE_MS}})
    assert _post(client, body).status_code == 200
    r = _post(client, json.dumps(BODY), {"X-Latencylab-Deadline-Ms": f"{MAX_DEADLINE_MS:.1e}"})  # "3.6e+06"
    assert r.status_code == 200, r.text


# --- 2. bodies no parser should hold, and the catch-all --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[" * 50_000, "nested too deeply"),
        ('{"inputs": ' + "[" * 5_000 + "]" * 5_000 + "}", "nested too deeply"),
        ('{"id": "x", "parameters": {"a": ' + '{"b":' * 3000 + "1" + "}" * 3001 + ', "inputs": []}', "too deeply"),
        (
            '{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [' + LONG_INT + ", 1, 1, 1]}]}",
            "4300",
        ),
        ('{"parameters": {"deadline_ms": ' + LONG_INT + '}, "inputs": []}', "4300"),
        ('{"id": ' + LONG_INT + ', "inputs": []}', "4300"),
    ],
    ids=["deep-array", "deep-inputs", "deep-parameters", "long-int-data", "long-int-deadline", "long-int-id"],
)
def test_json_too_deep_or_with_a_4300_digit_integer_is_400(client: TestClient, body: str, fragment: str) -> None:
    error = _json_error(_post(client, body), 400)
    assert error.startswith("malformed JSON") and fragment in error


@pytest.mark.parametrize(
    ("shape", "data", "status"),
    [
        ([int(HUGE_INT), 4], [], 413),  # a 400-digit dimension: never reaches numpy
        ([2**63, 4], [], 413),
    ],
)
def test_absurd_shapes_are_refused_before_numpy(
    client: TestClient, shape: list[int], data: list[int], status: int
) -> None:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": shape, "data": data}]})
    assert "over the limit" in _json_error(_post(client, body), status)


def test_a_zero_sized_shape_with_a_huge_dimension_is_413_not_a_numpy_error() -> None:
    # [10**400, 0] holds no element at all, so the element budget passes; numpy cannot make the array.
    specs = [TensorSpec("X", "FP32", (-1, -1))]
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [10**400, 0], "data": []}]})
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(body.encode(), "m", None, specs)
    assert info.value.status == 413 and "has a dimension over the limit" in str(info.value)
    assert parse_infer_request(body.replace(HUGE_INT, "7").encode(), "m", None, specs).inputs[0].shape == (7, 0)


@pytest.mark.parametrize("length", ["²", "9" * 5000, "99999999999999999999"])
def test_odd_content_length_values_are_not_a_500(length: str) -> None:
    # Through the ASGI app directly: a real HTTP parser would refuse some of these before the app sees them.
    state = _state()
    app = lifespan_app(state)
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        scope = {
            "type": "http",
            "method": "POST",
            "path": INFER,
            "raw_path": INFER.encode(),
            "query_string": b"",
            "headers": [(b"content-length", length.encode("latin-1")), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
            "scheme": "http",
            "http_version": "1.1",
            "root_path": "",
        }
        messages = [{"type": "http.request", "body": json.dumps(BODY).encode(), "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        await app(scope, receive, send)

    with TestClient(app) as c:  # the lifespan starts the batchers; the request runs on the same event loop
        assert c.portal is not None
        c.portal.call(run)
    status = sent[0]["status"]
    assert status in (200, 413), sent
    if status == 413:
        assert "exceeds the limit" in json.loads(sent[1]["body"])["error"]


def test_unexpected_exception_is_a_json_500_and_counted(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    state: ServerState = client.state  # type: ignore[attr-defined]
    svc = state.services["fake"]

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(svc, "infer", broken)
    assert _json_error(_post(client, json.dumps(BODY)), 500) == "internal server error (KeyError)"
    metrics = client.get("/metrics").text
    assert 'latencylab_server_errors_total{kind="internal",model="fake"} 1.0' in metrics
    assert 'latencylab_server_requests_total{code="500",model="fake",producer="-"} 1.0' in metrics


def test_exception_outside_a_handler_catch_is_a_json_500(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    state: ServerState = client.state  # type: ignore[attr-defined]

    def broken() -> bytes:
        raise RuntimeError("exposition failed")

    monkeypatch.setattr(state.metrics, "exposition", broken)
    assert _json_error(client.get("/metrics"), 500) == "internal server error (RuntimeError)"


# --- 5. 405 carries Allow --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v2/health/live", "GET, HEAD"),
        ("DELETE", "/v2/models/fake", "GET, HEAD"),
        ("GET", INFER, "POST"),
        ("PUT", "/v2/models/fake/versions/fp32/infer", "POST"),
    ],
)
def test_405_names_the_allowed_methods(client: TestClient, method: str, path: str, allow: str) -> None:
    r = client.request(method, path)
    assert r.headers["allow"] == allow
    assert _json_error(r, 405) == f"method {method} not allowed on {path} (allowed: {allow})"


# --- 10. the binary tensor data extension: codec ---------------------------------------------------------------------

# The codec tests' examples, with what only binary data carries: NaN and infinities, bytes that are not UTF-8.
EXAMPLES: dict[str, np.ndarray] = {
    **JSON_EXAMPLES,
    "FP16": np.array([[0.5, -2.0, 65504.0], [np.nan, np.inf, -np.inf]], dtype=np.float16),
    "FP32": np.array([[1.5, -0.25, 3.4028235e38], [np.nan, np.inf, -np.inf]], dtype=np.float32),
    "FP64": np.array([[1e-300, -1.7976931348623157e308, 0.1], [np.nan, np.inf, -np.inf]]),
    "BYTES": np.array([[b"h\xc3\xa9llo", b"", b"\xff\xfe not UTF-8"], [b"a", b"\x00" * 3, b"x y"]], dtype=object),
}


@pytest.fixture
def httpclient() -> Any:
    return pytest.importorskip("tritonclient.http")


def _triton_body(httpclient: Any, arrays: dict[str, tuple[str, np.ndarray, bool]], **kwargs: Any) -> tuple[bytes, Any]:
    inputs = []
    for name, (datatype, array, binary) in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, **kwargs)
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    return body, headers


@pytest.mark.parametrize("datatype", list(EXAMPLES))
def test_every_datatype_round_trips_as_binary_data_with_tritonclient(httpclient: Any, datatype: str) -> None:
    array = EXAMPLES[datatype]
    body, headers = _triton_body(httpclient, {"X": (datatype, array, True)})
    request, output_format = decode_infer_request(
        body, "m", None, [TensorSpec("X", datatype, (-1, 3))], headers=headers
    )
    got = request.inputs[0].data
    assert got.dtype == array.dtype and got.shape == array.shape
    if datatype == "BYTES":
        assert got.tolist() == array.tolist()
    else:
        np.testing.assert_array_equal(got, array)  # NaN == NaN here; signed infinities exact
    assert output_format == OutputFormat(default=True)  # no outputs named: tritonclient asks for all in binary

    response = InferResponse("m", "1", (Tensor("Y", datatype, (2, 3), got),))
    payload, json_length = encode_infer_body(response, None, output_format)
    assert json_length is not None
    head = json.loads(payload[:json_length])
    assert "data" not in head["outputs"][0]
    result = httpclient.InferResult.from_response_body(payload, header_length=json_length)
    back = result.as_numpy("Y")
    if datatype == "BYTES":
        assert back.tolist() == array.tolist()  # bytes, not UTF-8 strings: binary carries any bytes
    else:
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back, array)


def test_binary_and_json_inputs_mix_and_binary_parts_follow_the_request_order(httpclient: Any) -> None:
    specs = [TensorSpec("A", "INT32", (-1,)), TensorSpec("B", "BYTES", (-1,)), TensorSpec("C", "FP32", (-1,))]
    arrays = {  # listed C, B, A in the request: the binary parts come in that order
        "C": ("FP32", np.array([0.5, -1.0], np.float32), True),
        "B": ("BYTES", np.array([b"xy", b"z"], object), False),
        "A": ("INT32", np.array([7, 8, 9], np.int32), True),
    }
    body, headers = _triton_body(httpclient, arrays, outputs=[httpclient.InferRequestedOutput("C", binary_data=False)])
    request, output_format = decode_infer_request(body, "m", None, specs, headers=headers)
    assert [t.name for t in request.inputs] == ["A", "B", "C"]
    assert request.input("A").data.tolist() == [7, 8, 9]
    assert request.input("B").data.tolist() == [b"xy", b"z"]
    assert request.input("C").data.tolist() == [0.5, -1.0]
    assert output_format == OutputFormat(default=False, per_output={"C": False})


def test_output_format_per_output_overrides_the_request_default() -> None:
    a = Tensor("A", "INT32", (2,), np.array([1, 2], np.int32))
    b = Tensor("B", "FP32", (1,), np.array([np.inf], np.float32))
    fmt = OutputFormat(default=True, per_output={"A": False})
    payload, json_length = encode_infer_body(InferResponse("m", "", (a, b)), None, fmt)
    assert json_length is not None
    assert payload[json_length:] == np.array([np.inf], "<f4").tobytes()
    assert json.loads(payload[:json_length])["outputs"] == [
        {"name": "A", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "B", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}},
    ]
    all_json, none = encode_infer_body(InferResponse("m", "", (a,)), None, fmt)
    assert none is None and json.loads(all_json)["outputs"][0]["data"] == [1, 2]


def _binary(inputs: list[dict[str, Any]], blob: bytes, **extra: Any) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": inputs, **extra}).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def _x(datatype: str, shape: list[int], size: Any) -> dict[str, Any]:
    return {"name": "X", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


F4 = np.arange(4, dtype="<f4").tobytes()
BINARY_REFUSALS = [
    # (case, datatype, shape, binary_data_size, blob, message)
    ("size-short", "FP32", [4], 12, F4, "input 'X': binary_data_size is 12 but 4 FP32 elements take 16 bytes"),
    ("overrun", "FP32", [4], 16, F4[:12], "input 'X': binary_data_size 16 runs past the end of the body"),
    ("trailing", "FP32", [4], 16, F4 + b"!", "the body has 1 bytes after the binary tensor data the inputs declare"),
    ("negative", "FP32", [4], -16, F4, "input 'X': 'binary_data_size' must be a non-negative integer, got -16"),
    ("bool-size", "FP32", [4], True, F4, "input 'X': 'binary_data_size' must be a non-negative integer, got true"),
    ("float-size", "FP32", [4], 16.0, F4, "input 'X': 'binary_data_size' must be a non-negative integer, got 16.0"),
    ("huge-size", "FP32", [4], 10**30, F4, "input 'X': binary_data_size is 1000000000000000000000000000000 but 4"),
    ("bool-byte", "BOOL", [3], 3, b"\x01\x00\x02", "input 'X': element 2 is byte 2, expected 0 or 1 for BOOL"),
    ("bytes-prefix", "BYTES", [2], 9, b"\x03\x00\x00\x00abc\x00\x00", "input 'X': binary data ends inside element 1's"),
    ("bytes-over", "BYTES", [1], 6, b"\x09\x00\x00\x00ab", "input 'X': element 0 declares 9 bytes, but only 2 are"),
    ("bytes-extra", "BYTES", [1], 7, b"\x01\x00\x00\x00abc", "input 'X': binary_data_size is 7 but its 1 BYTES"),
    ("bytes-few", "BYTES", [3], 8, b"\x00" * 8, "input 'X': binary_data_size is 8, too small for 3 BYTES elements"),
]


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "blob", "message"),
    [r[1:] for r in BINARY_REFUSALS],
    ids=[r[0] for r in BINARY_REFUSALS],
)
def test_binary_data_that_disagrees_with_its_declaration_is_400(
    datatype: str, shape: list[int], size: Any, blob: bytes, message: str
) -> None:
    body, headers = _binary([_x(datatype, shape, size)], blob)
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(body, "m", None, [TensorSpec("X", datatype, (-1,))], headers=headers)
    assert info.value.status == 400
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("inputs", "extra", "headers", "message"),
    [
        (
            [{**_x("FP32", [4], 16), "data": [1, 2, 3, 4]}],
            {},
            None,
            "input 'X': give either 'data' or parameters.binary_data_size, not both",
        ),
        (
            [_x("FP32", [4], 16)],
            {},
            {},
            "the body has binary tensor data after its JSON: send the Inference-Header-Content-Length header",
        ),
        (
            [_x("FP32", [4], 16)],
            {"parameters": {"binary_data_output": 1}},
            None,
            "request parameter 'binary_data_output'",
        ),
        (
            [_x("FP32", [4], 16)],
            {"outputs": [{"name": "Y", "parameters": {"binary_data": "yes"}}]},
            None,
            "output 'Y': parameter 'binary_data' must be true or false, got \"yes\"",
        ),
    ],
    ids=["data-and-size", "no-header", "output-default-not-bool", "output-flag-not-bool"],
)
def test_binary_parameters_of_the_wrong_kind_are_400(
    inputs: list[dict[str, Any]], extra: dict[str, Any], headers: dict[str, str] | None, message: str
) -> None:
    body, with_header = _binary(inputs, F4, **extra)
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(
            body, "m", None, [TensorSpec("X", "FP32", (-1,))], headers=with_header if headers is None else headers
        )
    assert info.value.status == 400 and str(info.value).startswith(message)


def test_binary_element_budget_is_413_before_any_bytes_are_read() -> None:
    body, headers = _binary([_x("BYTES", [1000, 2000], 8_000_000)], b"")
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(body, "m", None, [TensorSpec("X", "BYTES", (-1, -1))], 1_000_000, headers=headers)
    assert (info.value.status, str(info.value)) == (413, "request has 2000000 elements, more than the limit of 1000000")


# --- 10. the binary tensor data extension: the app -------------------------------------------------------------------


def test_app_answers_binary_outputs_and_refuses_bad_binary_with_400(client: TestClient, httpclient: Any) -> None:
    x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    body, headers = _triton_body(httpclient, {"X": ("FP32", x, True)})
    r = _post(client, body, {**headers, "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    json_length = int(r.headers["inference-header-content-length"])
    head = json.loads(r.content[:json_length])
    assert head["outputs"] == [
        {"name": "Y", "datatype": "FP32", "shape": [2, 4], "parameters": {"binary_data_size": 32}}
    ]
    np.testing.assert_array_equal(np.frombuffer(r.content[json_length:], "<f4").reshape(2, 4), 2 * x)
    # the size disagrees with the shape: 400, and the server is fine afterwards
    bad = body.replace(b'"binary_data_size":32', b'"binary_data_size":28')
    assert "binary_data_size is 28" in _json_error(_post(client, bad, headers), 400)
    assert client.get("/v2").json()["extensions"] == ["binary_tensor_data", "latencylab-ladder"]


def test_compressed_request_bodies_are_refused_by_name(client: TestClient, httpclient: Any) -> None:
    import gzip

    body, headers = _triton_body(httpclient, {"X": ("FP32", np.ones((1, 4), np.float32), True)})
    r = _post(client, gzip.compress(body), {**headers, "Content-Encoding": "gzip"})
    assert _json_error(r, 415) == "Content-Encoding 'gzip' not supported: send the body uncompressed"
    assert _post(client, body, {**headers, "Content-Encoding": "identity"}).status_code == 200


def test_app_body_limit_applies_to_binary_bodies(httpclient: Any) -> None:
    state = _state(max_body_bytes=1024)
    body, headers = _triton_body(httpclient, {"X": ("FP32", np.ones((100, 4), np.float32), True)})
    assert len(body) > 1024
    with TestClient(lifespan_app(state)) as c:
        assert "exceeds the limit of 1024" in _json_error(_post(c, body, headers), 413)


# --- 8 and 10 against a real server ----------------------------------------------------------------------------------

LIMITS = HttpLimits(max_head_bytes=4096, head_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=1)


def _running(limits: HttpLimits = LIMITS) -> AbstractContextManager[tuple[str, int]]:
    """A real uvicorn server (the config ``run_server`` uses) in a thread, on loopback."""
    state = _state()
    state.limits = limits
    return uvicorn_thread(state)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    with _running() as address:
        yield address


def _read_response(
    conn: socket.socket, timeout_s: float = 5.0, linger_s: float = 5.0
) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, closed): one response read off ``conn``, and whether the server closed the
    connection within ``linger_s`` after it."""
    conn.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed without a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    conn.settimeout(linger_s)
    try:
        closed = conn.recv(1) == b""
    except TimeoutError:
        closed = False
    return status, headers, rest[:length], closed


def _request(body: bytes = b"", extra: str = "") -> bytes:
    head = f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{extra}"
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_a_request_head_over_the_limit_is_431_and_closed(server: tuple[str, int]) -> None:
    body = json.dumps(BODY).encode()
    with socket.create_connection(server) as conn:  # just under the limit: served
        conn.sendall(_request(body, f"X-Pad: {'a' * 3500}\r\n"))
        assert _read_response(conn, linger_s=0.01)[0] == 200
    # one header over the limit, sent at once
    with socket.create_connection(server) as conn:
        conn.sendall(_request(body, f"X-Pad: {'a' * 5000}\r\n"))
        status, headers, answer, closed = _read_response(conn)
    assert (status, closed) == (431, True)
    assert headers["content-type"] == "application/json"
    assert json.loads(answer) == {"error": "request line and headers exceed the limit of 4096 bytes"}
    # a head that never ends, trickled in 1-KiB pieces: refused once past the limit, not buffered forever
    with socket.create_connection(server) as conn:
        conn.sendall(f"POST {INFER} HTTP/1.1\r\nX-Pad: ".encode())
        for _ in range(64):
            if select.select([conn], [], [], 0.02)[0]:
                break
            conn.sendall(b"a" * 1024)
        status, _, answer, closed = _read_response(conn)
    assert (status, closed) == (431, True)


def test_an_8_mb_header_is_refused_not_served(server: tuple[str, int]) -> None:
    request = _request(json.dumps(BODY).encode(), f"X-Pad: {'a' * 8_000_000}\r\n")
    with socket.create_connection(server) as conn:
        conn.settimeout(10)
        try:
            conn.sendall(request)
            reply = conn.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            reply = b""  # closed while we were still sending: refused all the same
    assert not reply.startswith(b"HTTP/1.1 200")
    assert reply == b"" or reply.startswith(b"HTTP/1.1 431")


def test_a_stalled_head_is_408_and_an_idle_connection_is_closed(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as conn:
        t0 = time.monotonic()
        conn.sendall(f"POST {INFER} HTTP/1.1\r\nHost: t\r\n".encode())  # and nothing more
        status, _, answer, closed = _read_response(conn)
        waited = time.monotonic() - t0
    assert (status, closed) == (408, True)
    assert json.loads(answer) == {"error": "request head not received within 0.5 s"}
    assert 0.4 < waited < 5.0
    with socket.create_connection(server) as conn:  # not one byte sent: closed without an answer
        conn.settimeout(5)
        t0 = time.monotonic()
        assert conn.recv(1) == b""
        assert 0.4 < time.monotonic() - t0 < 5.0


def test_a_stalled_body_is_408_and_closed(server: tuple[str, int]) -> None:
    body = json.dumps(BODY).encode()
    with socket.create_connection(server) as conn:
        t0 = time.monotonic()
        conn.sendall(_request(body)[: -len(body) // 2])  # the head and half the body
        status, headers, answer, closed = _read_response(conn)
        waited = time.monotonic() - t0
    assert (status, closed) == (408, True)
    assert headers["connection"] == "close"
    assert json.loads(answer) == {"error": "request body not received within 0.5 s"}
    assert 0.4 < waited < 5.0


def test_keep_alive_serves_several_requests_then_closes_an_idle_connection(server: tuple[str, int]) -> None:
    body = json.dumps(BODY).encode()
    with socket.create_connection(server) as conn:
        for _ in range(3):
            conn.sendall(_request(body))
            status, _, answer, closed = _read_response(conn, linger_s=0.01)
            assert not closed  # kept open for the next request
            assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
        conn.settimeout(5)
        t0 = time.monotonic()
        assert conn.recv(1) == b""  # idle: closed by the keep-alive (1 s) or head (0.5 s) timer
        assert time.monotonic() - t0 < 3.0


def test_a_malformed_request_is_a_json_400(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as conn:
        conn.sendall(b"POST /v2 HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
        status, headers, answer, closed = _read_response(conn)
    assert (status, closed) == (400, True)
    assert headers["content-type"] == "application/json"
    assert json.loads(answer)["error"].startswith("malformed HTTP request")


def test_tritonclient_defaults_binary_in_and_out_against_a_real_server(
    server: tuple[str, int], httpclient: Any
) -> None:
    client = httpclient.InferenceServerClient(f"{server[0]}:{server[1]}")
    try:
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
        inp = httpclient.InferInput("X", [3, 4], "FP32")
        inp.set_data_from_numpy(x)  # binary_data=True: tritonclient's default
        result = client.infer("fake", [inp])  # no outputs named: binary_data_output = true
        assert result.get_output("Y")["parameters"] == {"binary_data_size": 48}
        np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x)
        out = httpclient.InferRequestedOutput("Y")  # binary_data=True by default too
        result = client.infer("fake", [inp], outputs=[out], request_id="r1")
        assert result.get_response()["id"] == "r1"
        np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x)
        json_out = httpclient.InferRequestedOutput("Y", binary_data=False)
        result = client.infer("fake", [inp], outputs=[json_out])
        assert result.get_output("Y")["data"] == (2 * x).reshape(-1).tolist()
    finally:
        client.close()
