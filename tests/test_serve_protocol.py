"""The Open Inference Protocol codec: parsing, validation messages, encoding, and interop with tritonclient."""

from __future__ import annotations

import json
import math
from itertools import chain
from typing import Any

import numpy as np
import pytest

from latencylab.serve.protocol_request import check_requested_outputs, parse_infer_request
from latencylab.serve.protocol_response import encode_infer_response, error_body, model_metadata, server_metadata
from latencylab.serve.types import InferResponse, ProtocolError, Tensor, TensorSpec

# One example per datatype, with its extreme values, as (nested JSON data, numpy array).
EXAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]], dtype=np.bool_),
    "UINT8": np.array([[0, 1, 255], [7, 128, 254]], dtype=np.uint8),
    "UINT16": np.array([[0, 65535, 3], [4, 5, 6]], dtype=np.uint16),
    "UINT32": np.array([[0, 4294967295, 3], [4, 5, 6]], dtype=np.uint32),
    "UINT64": np.array([[0, 18446744073709551615, 3], [4, 5, 6]], dtype=np.uint64),
    "INT8": np.array([[-128, 127, 0], [-1, 1, 2]], dtype=np.int8),
    "INT16": np.array([[-32768, 32767, 0], [-1, 1, 2]], dtype=np.int16),
    "INT32": np.array([[-2147483648, 2147483647, 0], [-1, 1, 2]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1, 0], [-1, 1, 2]], dtype=np.int64),
    "FP16": np.array([[0.5, -2.0, 65504.0], [0.0999755859375, 1e-4, -0.0]], dtype=np.float16),
    "FP32": np.array([[1.5, -0.25, 3.4028234663852886e38], [0.1, 1e-30, -7.0]], dtype=np.float32),
    "FP64": np.array([[1e-300, -1.7976931348623157e308, 0.1], [2.5, -3.0, 1 / 3]], dtype=np.float64),
    "BYTES": np.array([["héllo".encode(), "日本語".encode(), b""], [b"a", "🙂".encode(), b"x y"]], dtype=object),
}


def _json_data(array: np.ndarray) -> list[Any]:
    """Nested JSON data for ``array`` (BYTES as text), as a client writes it."""
    if array.dtype == object:
        return [[v.decode() for v in row] for row in array.tolist()]
    return array.tolist()


def _body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def _input(name: str, datatype: str, shape: list[int], data: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data, **extra}


def _refusal(body: bytes, specs: list[TensorSpec], **kwargs: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(body, "m", None, specs, **kwargs)
    return info.value


TEXT = [TensorSpec("TEXT", "BYTES", (-1, 3))]
IDS = [TensorSpec("IDS", "INT64", (-1, 4)), TensorSpec("MASK", "BOOL", (-1, 4))]


# --- round trips -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(EXAMPLES))
def test_every_datatype_round_trips_through_parse_and_encode(datatype: str) -> None:
    array = EXAMPLES[datatype]
    spec = TensorSpec("X", datatype, (-1, 3))
    request = parse_infer_request(
        _body(_input("X", datatype, [2, 3], _json_data(array))), "m", "1", [spec], headers={"Content-Type": "x"}
    )
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, (2, 3))
    assert tensor.data.dtype == array.dtype
    assert tensor.data.shape == (2, 3)
    assert tensor.data.tolist() == array.tolist()  # exact, element by element (bytes compare as bytes)

    body = encode_infer_response(InferResponse("m", "1", (tensor,), id="r"))
    (out,) = json.loads(body)["outputs"]
    assert out == {
        "name": "X",
        "datatype": datatype,
        "shape": [2, 3],
        "data": list(chain.from_iterable(_json_data(array))),
    }


def test_request_fields_are_kept() -> None:
    body = _body(
        _input("IDS", "INT64", [1, 4], [[101, 7, 8, 102]]),
        _input("MASK", "BOOL", [1, 4], [True, True, True, False]),
        id="req-42",
        parameters={"deadline_ms": 25.5, "priority": 3},
        outputs=[{"name": "EMB", "parameters": {"binary_data": True}}, {"name": "POOLED"}],
    )
    request = parse_infer_request(body, "minilm", "2", IDS)
    assert (request.model, request.version, request.id) == ("minilm", "2", "req-42")
    assert request.parameters == {"deadline_ms": 25.5, "priority": 3}
    assert request.outputs == ("EMB", "POOLED")
    assert request.input("IDS").data.tolist() == [[101, 7, 8, 102]]
    assert request.input("MASK").data.tolist() == [[True, True, True, False]]


def test_inputs_come_back_in_spec_order_and_outputs_default_to_all() -> None:
    body = _body(_input("MASK", "BOOL", [1, 4], [True] * 4), _input("IDS", "INT64", [1, 4], [1, 2, 3, 4]), outputs=[])
    request = parse_infer_request(body, "m", None, IDS)
    assert [t.name for t in request.inputs] == ["IDS", "MASK"]
    assert request.outputs is None
    assert request.id == ""
    assert request.parameters == {}


def test_nested_and_flat_data_give_the_same_array() -> None:
    spec = [TensorSpec("X", "FP32", (2, 3, 2))]
    values = list(range(12))
    nested = [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9], [10, 11]]]
    flat = parse_infer_request(_body(_input("X", "FP32", [2, 3, 2], values)), "m", None, spec).inputs[0].data
    deep = parse_infer_request(_body(_input("X", "FP32", [2, 3, 2], nested)), "m", None, spec).inputs[0].data
    assert flat.dtype == deep.dtype == np.float32
    assert flat.shape == deep.shape == (2, 3, 2)
    np.testing.assert_array_equal(flat, deep)
    assert deep[1, 2, 0] == 10.0
    assert deep[0, 1, 1] == 3.0


def test_bytes_are_utf8_encoded_text() -> None:
    request = parse_infer_request(_body(_input("TEXT", "BYTES", [1, 3], ["naïve", "日本語", "🙂"])), "m", None, TEXT)
    data = request.inputs[0].data
    assert data.dtype == object
    assert data.tolist() == [[b"na\xc3\xafve", b"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", b"\xf0\x9f\x99\x82"]]
    body = encode_infer_response(InferResponse("m", "", (Tensor("TEXT", "BYTES", (1, 3), data),)))
    assert json.loads(body)["outputs"][0]["data"] == ["naïve", "日本語", "🙂"]
    assert "日本語".encode() in body  # written as UTF-8, not \u escapes


def test_numbers_accepted_in_their_looser_forms() -> None:
    ints = [TensorSpec("X", "INT32", (3,))]
    assert parse_infer_request(_body(_input("X", "INT32", [3], [1.0, -2.0, 1e3])), "m", None, ints).inputs[
        0
    ].data.tolist() == [1, -2, 1000]
    floats = [TensorSpec("X", "FP16", (3,))]
    data = parse_infer_request(_body(_input("X", "FP16", [3], [1, 0.5, -3])), "m", None, floats).inputs[0].data
    assert data.dtype == np.float16
    assert data.tolist() == [1.0, 0.5, -3.0]
    # Python's and tritonclient's encoders write NaN/Infinity tokens; real non-finite inputs pass through.
    body = b'{"inputs":[{"name":"X","shape":[3],"datatype":"FP16","data":[NaN,Infinity,-Infinity]}]}'
    data = parse_infer_request(body, "m", None, floats).inputs[0].data
    assert math.isnan(data[0]) and data[1] == np.inf and data[2] == -np.inf


def test_zero_size_tensors() -> None:
    spec = [TensorSpec("X", "INT64", (-1, 4))]
    tensor = parse_infer_request(_body(_input("X", "INT64", [0, 4], [])), "m", None, spec).inputs[0]
    assert tensor.data.shape == (0, 4)
    assert tensor.data.dtype == np.int64
    body = encode_infer_response(InferResponse("m", "", (tensor,)))
    assert json.loads(body)["outputs"][0] == {"name": "X", "datatype": "INT64", "shape": [0, 4], "data": []}


def test_scalar_tensor_with_empty_shape() -> None:
    spec = [TensorSpec("T", "FP64", ())]
    tensor = parse_infer_request(_body(_input("T", "FP64", [], [0.25])), "m", None, spec).inputs[0]
    assert tensor.data.shape == ()
    assert float(tensor.data) == 0.25


# --- refusals --------------------------------------------------------------------------------------------------------

F32 = [TensorSpec("X", "FP32", (-1, 3))]
U8 = [TensorSpec("X", "UINT8", (2,))]
I64 = [TensorSpec("X", "INT64", (2,))]
B = [TensorSpec("X", "BOOL", (2,))]
F16 = [TensorSpec("X", "FP16", (2,))]

REFUSALS = [
    # (case, body, specs, message)
    ("json", b'{"inputs": [', F32, "malformed JSON: Expecting value: line 1 column 13 (char 12)"),
    ("empty", b"", F32, "malformed JSON: Expecting value: line 1 column 1 (char 0)"),
    ("utf8", b'{"inputs": ["\xff"]}', F32, "malformed JSON: body is not valid UTF-8"),
    ("not-object", b"[1, 2]", F32, "request body must be a JSON object, got an array"),
    ("no-inputs", b"{}", F32, "request has no 'inputs'"),
    ("inputs-type", b'{"inputs": {}}', F32, "'inputs' must be a JSON array, got an object"),
    ("id-type", _body(id=7), F32, "'id' must be a string, got a number"),
    ("params-type", _body(parameters=[1]), F32, "request 'parameters' must be a JSON object, got an array"),
    ("input-type", _body(3), F32, "inputs[0] must be a JSON object, got a number"),
    ("no-name", _body({"shape": [1, 3]}), F32, "inputs[0] has no 'name' string"),
    (
        "unknown",
        _body(_input("TEXT", "BYTES", [1, 3], ["a", "b", "c"]), _input("Y", "FP32", [1], [1.0])),
        TEXT,
        "unknown input 'Y' (model inputs: 'TEXT')",
    ),
    (
        "missing",
        _body(_input("IDS", "INT64", [1, 4], [1, 2, 3, 4])),
        IDS,
        "missing required input 'MASK' (model inputs: 'IDS', 'MASK')",
    ),
    ("twice", _body(_input("X", "UINT8", [2], [1, 2]), _input("X", "UINT8", [2], [1, 2])), U8, "input 'X' given twice"),
    (
        "bad-datatype",
        _body(_input("X", "FLOAT", [1, 3], [1, 2, 3])),
        F32,
        "input 'X': unknown datatype \"FLOAT\" "
        "(one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES, BF16)",
    ),
    (
        "bf16",
        _body(_input("X", "BF16", [1, 3], [1, 2, 3])),
        F32,
        "input 'X': datatype BF16 cannot be sent as JSON data",
    ),
    (
        "datatype-mismatch",
        _body(_input("X", "FP64", [1, 3], [1, 2, 3])),
        F32,
        "input 'X': datatype FP64 does not match the model's FP32",
    ),
    (
        "shape-type",
        _body(_input("X", "FP32", [1, "3"], [1, 2, 3])),
        F32,
        "input 'X': 'shape' must be an array of non-negative integers, got [1, \"3\"]",
    ),
    (
        "shape-negative",
        _body(_input("X", "FP32", [-1, 3], [])),
        F32,
        "input 'X': 'shape' must be an array of non-negative integers, got [-1, 3]",
    ),
    (
        "shape-dim",
        _body(_input("X", "FP32", [1, 4], [1, 2, 3, 4])),
        F32,
        "input 'X': shape [1, 4] does not match the model's [-1, 3]",
    ),
    (
        "shape-rank",
        _body(_input("X", "FP32", [3], [1, 2, 3])),
        F32,
        "input 'X': shape [3] does not match the model's [-1, 3]",
    ),
    ("no-data", _body({"name": "X", "shape": [1, 3], "datatype": "FP32"}), F32, "input 'X': no 'data'"),
    (
        "data-type",
        _body(_input("X", "FP32", [1, 3], "1,2,3")),
        F32,
        "input 'X': 'data' must be a JSON array, got a string",
    ),
    (
        "count",
        _body(_input("TEXT", "BYTES", [1, 3], ["a", "b"])),
        TEXT,
        "input 'TEXT': expected 3 elements for shape [1, 3], got 2",
    ),
    (
        "nested-len",
        _body(_input("X", "FP32", [2, 3], [[1, 2, 3], [4, 5]])),
        F32,
        "input 'X': nested data does not match shape [2, 3]: expected 3 items at depth 1, got 2 items",
    ),
    (
        "nested-rows",
        _body(_input("X", "FP32", [2, 3], [[1, 2, 3]])),
        F32,
        "input 'X': nested data does not match shape [2, 3]: expected 2 items at depth 0, got 1 items",
    ),
    (
        "nested-mixed",
        _body(_input("X", "FP32", [2, 3], [[1, 2, 3], 4])),
        F32,
        "input 'X': nested data does not match shape [2, 3]: expected 3 items at depth 1, got the element 4",
    ),
    (
        "too-deep",
        _body(_input("X", "FP32", [1, 3], [[[1], [2], [3]]])),
        F32,
        "input 'X': data is nested deeper than its shape, or mixes arrays and values",
    ),
    (
        "flat-mixed",
        _body(_input("X", "FP32", [1, 3], [1, [2], 3])),
        F32,
        "input 'X': data is nested deeper than its shape, or mixes arrays and values",
    ),
    (
        "fp-string",
        _body(_input("X", "FP32", [1, 3], [1, "2", 3])),
        F32,
        "input 'X': element 1 is \"2\", expected a number",
    ),
    (
        "fp-bool",
        _body(_input("X", "FP32", [1, 3], [1, 2, True])),
        F32,
        "input 'X': element 2 is true, expected a number",
    ),
    (
        "fp-null",
        _body(_input("X", "FP32", [1, 3], [None, 2, 3])),
        F32,
        "input 'X': element 0 is null, expected a number",
    ),
    (
        "fp16-range",
        _body(_input("X", "FP16", [2], [1.0, 70000])),
        F16,
        "input 'X': element 1 is 70000, out of range for FP16",
    ),
    (
        "fp32-range",
        _body(_input("X", "FP32", [1, 3], [1, 2, 1e39])),
        F32,
        "input 'X': element 2 is 1e+39, out of range for FP32",
    ),
    (
        "int-fraction",
        _body(_input("X", "INT64", [2], [1, 1.5])),
        I64,
        "input 'X': element 1 is 1.5, expected an integer",
    ),
    ("int-bool", _body(_input("X", "INT64", [2], [True, 1])), I64, "input 'X': element 0 is true, expected an integer"),
    (
        "int-range",
        _body(_input("X", "UINT8", [2], [255, 300])),
        U8,
        "input 'X': element 1 is 300, out of range for UINT8 [0, 255]",
    ),
    (
        "uint-negative",
        _body(_input("X", "UINT8", [2], [-1, 3])),
        U8,
        "input 'X': element 0 is -1, out of range for UINT8 [0, 255]",
    ),
    (
        "int64-range",
        _body(_input("X", "INT64", [2], [0, 2**63])),
        I64,
        "input 'X': element 1 is 9223372036854775808, "
        "out of range for INT64 [-9223372036854775808, 9223372036854775807]",
    ),
    (
        "bool-int",
        _body(_input("X", "BOOL", [2], [True, 0])),
        B,
        "input 'X': element 1 is 0, expected a boolean (true/false)",
    ),
    (
        "bytes-number",
        _body(_input("TEXT", "BYTES", [1, 3], ["a", 5, "c"])),
        TEXT,
        "input 'TEXT': element 1 is 5, expected a string",
    ),
    (
        "bytes-surrogate",
        b'{"inputs":[{"name":"TEXT","shape":[1,3],"datatype":"BYTES","data":["a","b","\\ud800"]}]}',
        TEXT,
        "input 'TEXT': element 2 is \"\\ud800\", not valid Unicode (lone surrogate)",
    ),
    (
        "long-value",
        _body(_input("X", "FP32", [1, 3], [1, 2, "x" * 100])),
        F32,
        "input 'X': element 2 is \"" + "x" * 36 + "..., expected a number",
    ),
    (
        "binary-param",
        _body({"name": "X", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}),
        F32,
        "input 'X' has binary_data_size but the request has no Inference-Header-Content-Length header",
    ),
    (
        "shm",
        _body(_input("X", "FP32", [1, 3], [1, 2, 3], parameters={"shared_memory_region": "r"})),
        F32,
        "input 'X': shared-memory extension not supported; send JSON or binary data",
    ),
    (
        "input-params",
        _body(_input("X", "FP32", [1, 3], [1, 2, 3], parameters="p")),
        F32,
        "input 'X': 'parameters' must be a JSON object, got a string",
    ),
    ("outputs-type", _body(outputs={"name": "Y"}), F32, "'outputs' must be a JSON array, got an object"),
    ("output-name", _body(outputs=[{"name": 3}]), F32, "outputs[0] must be a JSON object with a 'name' string"),
    ("output-twice", _body(outputs=[{"name": "Y"}, {"name": "Y"}]), F32, "output 'Y' requested twice"),
    (
        "classification",
        _body(outputs=[{"name": "Y", "parameters": {"classification": 3}}]),
        F32,
        "output 'Y': classification extension not supported",
    ),
    (
        "deadline-zero",
        _body(parameters={"deadline_ms": 0}),
        F32,
        "parameter 'deadline_ms' must be a positive number of milliseconds, got 0",
    ),
    (
        "deadline-negative",
        _body(parameters={"deadline_ms": -5.5}),
        F32,
        "parameter 'deadline_ms' must be a positive number of milliseconds, got -5.5",
    ),
    (
        "deadline-string",
        _body(parameters={"deadline_ms": "50"}),
        F32,
        "parameter 'deadline_ms' must be a positive number of milliseconds, got \"50\"",
    ),
    (
        "deadline-bool",
        _body(parameters={"deadline_ms": True}),
        F32,
        "parameter 'deadline_ms' must be a positive number of milliseconds, got true",
    ),
    (
        "deadline-inf",
        b'{"inputs":[],"parameters":{"deadline_ms":Infinity}}',
        F32,
        "parameter 'deadline_ms' must be a positive number of milliseconds, got Infinity",
    ),
]


@pytest.mark.parametrize(("body", "specs", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_are_400_with_a_precise_message(body: bytes, specs: list[TensorSpec], message: str) -> None:
    error = _refusal(body, specs)
    assert error.status == 400
    assert str(error) == message


def test_too_many_elements_is_413_before_any_conversion() -> None:
    # 2 x 3 FP32 plus ... the element budget covers the whole request; the data is not even looked at.
    body = _body(_input("X", "FP32", [4, 3], "never read"))
    error = _refusal(body, F32, max_elements=11)
    assert error.status == 413
    assert str(error) == "request has 12 elements, more than the limit of 11"
    assert parse_infer_request(_body(_input("X", "FP32", [4, 3], [0] * 12)), "m", None, F32, max_elements=12)


def test_element_budget_is_over_all_inputs() -> None:
    body = _body(_input("IDS", "INT64", [2, 4], [0] * 8), _input("MASK", "BOOL", [2, 4], [True] * 8))
    error = _refusal(body, IDS, max_elements=15)
    assert (error.status, str(error)) == (413, "request has 16 elements, more than the limit of 15")


def test_binary_extension_header_on_an_all_json_body_is_accepted_and_a_bad_one_refused() -> None:
    body = _body(_input("X", "FP32", [1, 3], [1, 2, 3]))
    for key in ("Inference-Header-Content-Length", "inference-header-content-length"):
        request = parse_infer_request(body, "m", None, F32, headers={key: str(len(body))})
        assert request.inputs[0].data.tolist() == [[1, 2, 3]]
    for value in ("60x", "-1", str(len(body) + 1), "9" * 30):
        error = _refusal(body, F32, headers={"Inference-Header-Content-Length": value})
        assert error.status == 400
        assert str(error).startswith("header Inference-Header-Content-Length must be the JSON part's length")


# --- tritonclient interop --------------------------------------------------------------------------------------------


@pytest.fixture
def httpclient() -> Any:
    """tritonclient's HTTP module: the reference client these tests hold the codec to."""
    return pytest.importorskip("tritonclient.http")


def _triton_input(httpclient: Any, name: str, array: np.ndarray, datatype: str, binary: bool = False) -> Any:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_request_body_written_by_tritonclient_parses_to_the_same_arrays(httpclient: Any) -> None:
    specs = [
        TensorSpec("IMG", "FP32", (-1, 2, 2)),
        TensorSpec("IDS", "INT64", (-1,)),
        TensorSpec("TEXT", "BYTES", (-1,)),
        TensorSpec("FLAGS", "BOOL", (-1,)),
        TensorSpec("HALF", "FP16", (-1,)),
        TensorSpec("PIX", "UINT8", (-1,)),
    ]
    arrays = {
        "IMG": np.arange(8, dtype=np.float32).reshape(2, 2, 2) / 3,
        "IDS": np.array([-(2**63), 2**63 - 1, 5], dtype=np.int64),
        "TEXT": np.array(["héllo".encode(), b"", "日本".encode()], dtype=object),
        "FLAGS": np.array([True, False], dtype=np.bool_),
        "HALF": np.array([0.1, np.nan, -np.inf], dtype=np.float16),
        "PIX": np.array([0, 255], dtype=np.uint8),
    }
    inputs = [_triton_input(httpclient, s.name, arrays[s.name], s.datatype) for s in specs]
    outputs = [httpclient.InferRequestedOutput("EMB", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="abc", parameters={"deadline_ms": 40}
    )
    assert json_size is None  # all JSON: no Inference-Header-Content-Length
    request = parse_infer_request(body, "m", None, specs)
    assert request.id == "abc"
    assert request.parameters == {"deadline_ms": 40}
    assert request.outputs == ("EMB",)
    for spec in specs:
        got = request.input(spec.name).data
        assert got.dtype == arrays[spec.name].dtype, spec.name
        assert got.shape == arrays[spec.name].shape, spec.name
        np.testing.assert_array_equal(got, arrays[spec.name], err_msg=spec.name)  # NaN == NaN here


def test_tritonclient_default_request_asks_for_binary_outputs_and_still_parses(httpclient: Any) -> None:
    # With no outputs given, tritonclient adds parameters.binary_data_output = true; we answer JSON regardless.
    body, _ = httpclient.InferenceServerClient.generate_request_body(
        [_triton_input(httpclient, "X", np.ones((1, 3), np.float32), "FP32")]
    )
    request = parse_infer_request(body, "m", None, F32)
    assert request.parameters == {"binary_data_output": True}
    assert request.outputs is None
    assert request.inputs[0].data.tolist() == [[1.0, 1.0, 1.0]]


def test_tritonclient_binary_request_parses_with_the_header_and_is_refused_without(httpclient: Any) -> None:
    for array, datatype in (
        (np.ones((1, 3), np.float32), "FP32"),
        (np.array([[b"a", b"\xff", b"c"]], object), "BYTES"),
    ):
        specs = [TensorSpec("X", datatype, (-1, 3))]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [_triton_input(httpclient, "X", array, datatype, binary=True)]
        )
        assert json_size is not None
        request = parse_infer_request(
            body, "m", None, specs, headers={"Inference-Header-Content-Length": str(json_size)}
        )
        assert request.inputs[0].data.tolist() == array.tolist()
        error = _refusal(body, specs)
        assert (error.status, str(error)) == (
            400,
            "the body has binary tensor data after its JSON: send the Inference-Header-Content-Length header "
            "with the JSON's length",
        )


def test_encoded_response_is_read_back_by_tritonclient(httpclient: Any) -> None:
    outputs = tuple(Tensor(dt, dt, (2, 3), array) for dt, array in EXAMPLES.items())
    body = encode_infer_response(InferResponse("minilm", "3", outputs, id="req-9", parameters={"variant": "fp32"}))
    result = httpclient.InferResult.from_response_body(body)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("minilm", "3", "req-9")
    assert response["parameters"] == {"variant": "fp32"}
    for datatype, array in EXAMPLES.items():
        got = result.as_numpy(datatype)
        assert got.shape == (2, 3), datatype
        if datatype == "BYTES":
            # tritonclient hands JSON BYTES back as str objects, not bytes.
            assert got.tolist() == [[v.decode() for v in row] for row in array.tolist()]
        else:
            assert got.dtype == array.dtype, datatype
            np.testing.assert_array_equal(got, array, err_msg=datatype)


def test_non_finite_floats_become_null_and_tritonclient_reads_nan(httpclient: Any) -> None:
    array = np.array([1.5, np.nan, np.inf, -np.inf], dtype=np.float32)
    body = encode_infer_response(InferResponse("m", "", (Tensor("Y", "FP32", (4,), array),)))
    assert body == (
        b'{"model_name":"m","id":"","outputs":[{"name":"Y","datatype":"FP32","shape":[4],"data":[1.5,null,null,null]}]}'
    )
    json.loads(body, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    got = httpclient.InferResult.from_response_body(body).as_numpy("Y")
    assert got.dtype == np.float32
    assert got[0] == 1.5
    assert np.isnan(got[1:]).all()


# --- responses -------------------------------------------------------------------------------------------------------


def _response(*tensors: Tensor, **kwargs: Any) -> InferResponse:
    return InferResponse("m", "1", tensors, **kwargs)


A = Tensor("A", "INT32", (2,), np.array([1, 2], dtype=np.int32))
Bt = Tensor("B", "FP64", (1,), np.array([0.5]))


def test_response_body_is_compact_and_exact() -> None:
    body = encode_infer_response(_response(A, Bt, id="x"))
    assert body == (
        b'{"model_name":"m","model_version":"1","id":"x","outputs":['
        b'{"name":"A","datatype":"INT32","shape":[2],"data":[1,2]},'
        b'{"name":"B","datatype":"FP64","shape":[1],"data":[0.5]}]}'
    )


def test_requested_outputs_are_selected_in_request_order() -> None:
    body = json.loads(encode_infer_response(_response(A, Bt), requested=("B", "A")))
    assert [o["name"] for o in body["outputs"]] == ["B", "A"]
    body = json.loads(encode_infer_response(_response(A, Bt), requested=("B",)))
    assert [o["name"] for o in body["outputs"]] == ["B"]


def test_unknown_requested_output_is_400() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_infer_response(_response(A, Bt), requested=("C",))
    assert (info.value.status, str(info.value)) == (400, "unknown output 'C' (model outputs: 'A', 'B')")
    specs = [TensorSpec("A", "INT32", (-1,)), TensorSpec("B", "FP64", (-1,))]
    check_requested_outputs(None, specs)
    check_requested_outputs(("B", "A"), specs)
    with pytest.raises(ProtocolError) as info:
        check_requested_outputs(("A", "EMB"), specs)
    assert (info.value.status, str(info.value)) == (400, "unknown output 'EMB' (model outputs: 'A', 'B')")


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (
            Tensor("T", "BYTES", (2,), np.array([b"ok", b"\xff\xfe"], dtype=object)),
            "output 'T': element 1 is not valid UTF-8 and cannot be sent as JSON",
        ),
        (Tensor("T", "BYTES", (1,), np.array([3], dtype=object)), "output 'T': element 0 is a int, not bytes"),
        (Tensor("T", "FP32", (3,), np.zeros(2, np.float32)), "output 'T': data has shape [2], declared [3]"),
        (Tensor("T", "INT64", (2,), np.array([1.0, 1.5])), "output 'T': float64 values do not fit INT64"),
        (Tensor("T", "UINT8", (1,), np.array([256])), "output 'T': int64 values do not fit UINT8"),
        (Tensor("T", "FP8", (1,), np.array([1.0])), "output 'T': unknown datatype 'FP8'"),
    ],
)
def test_unrepresentable_outputs_are_500(tensor: Tensor, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        encode_infer_response(_response(tensor))
    assert (info.value.status, str(info.value)) == (500, message)


def test_outputs_of_a_near_dtype_are_cast_when_values_survive() -> None:
    tensors = (
        Tensor("F", "FP32", (2,), np.array([0.5, 2.0], dtype=np.float64)),
        Tensor("I", "INT32", (2,), np.array([7, -7], dtype=np.int64)),
        Tensor("S", "BYTES", (2,), np.array([b"ab", b"c"])),  # fixed-width bytes, not object
    )
    body = json.loads(encode_infer_response(_response(*tensors)))
    assert [o["data"] for o in body["outputs"]] == [[0.5, 2.0], [7, -7], ["ab", "c"]]


def test_response_parameters_accept_numpy_scalars_and_refuse_nan() -> None:
    body = json.loads(encode_infer_response(_response(A, parameters={"batch": np.int64(4), "ms": np.float32(1.5)})))
    assert body["parameters"] == {"batch": 4, "ms": 1.5}
    with pytest.raises(ProtocolError) as info:
        encode_infer_response(_response(A, parameters={"x": float("nan")}))
    assert info.value.status == 500
    assert str(info.value).startswith("response parameters are not JSON-serialisable")


def test_unversioned_response_leaves_out_model_version() -> None:
    body = json.loads(encode_infer_response(InferResponse("m", "", (A,))))
    assert list(body) == ["model_name", "id", "outputs"]


# --- metadata and errors ---------------------------------------------------------------------------------------------


def test_model_and_server_metadata() -> None:
    meta = model_metadata(
        "minilm",
        ["1", "2"],
        "onnx_onnxv1",
        [TensorSpec("TEXT", "BYTES", (-1,))],
        [TensorSpec("EMB", "FP32", (-1, 384))],
    )
    assert meta == {
        "name": "minilm",
        "versions": ["1", "2"],
        "platform": "onnx_onnxv1",
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "EMB", "datatype": "FP32", "shape": [-1, 384]}],
    }
    json.dumps(meta)
    from latencylab import __version__

    assert server_metadata(["deadline"]) == {"name": "latencylab", "version": __version__, "extensions": ["deadline"]}
    assert server_metadata()["extensions"] == []


def test_error_body() -> None:
    assert error_body("input 'X': bad") == b'{"error": "input \'X\': bad"}'
    assert json.loads(error_body('say "hi" \u00e9')) == {"error": 'say "hi" \u00e9'}
