"""Open Inference Protocol (KServe v2) HTTP/JSON codec.

Turns request bodies into :class:`InferRequest` values and :class:`InferResponse`
values into response bodies, and builds the metadata and error bodies, exactly
as the protocol's HTTP/REST section describes them. No I/O happens here: the
app hands in bytes (and, optionally, the request headers) and gets values back.

What the codec accepts and how it answers:

- Tensor ``data`` is a JSON array, either flat (row-major) or nested exactly
  as ``shape`` is (``[[1, 2], [3, 4]]`` for ``[2, 2]``); nesting that does not
  follow the shape is refused rather than guessed at.
- Elements must already have the declared type: JSON booleans for BOOL,
  integral numbers in the dtype's range for the integer types (``3.0`` is
  accepted as 3, ``1.5`` and ``true`` are not), numbers for FP16/32/64 (the
  JSON extensions ``NaN``/``Infinity`` that Python's and tritonclient's JSON
  encoders write are accepted), strings for BYTES (stored as UTF-8 ``bytes``).
- Only the JSON tensor representation is supported. Triton's binary tensor
  extension (``Inference-Header-Content-Length`` or an input parameter
  ``binary_data_size``) and its shared-memory and classification extensions
  are refused with a 400 that says so. A request for *binary outputs*
  (``binary_data_output`` / ``"binary_data": true``, which tritonclient sets
  by default) is not an error: outputs are always answered as JSON, which
  tritonclient reads just as well.
- Every refusal is a :class:`ProtocolError`: 400 with a one-line message that
  names the input, 413 when a request declares more elements than allowed.
- Non-finite floats in outputs (NaN, +Inf, -Inf) are encoded as JSON ``null``
  so that the body stays valid JSON (RFC 8259 has no NaN); tritonclient's
  ``as_numpy`` turns ``null`` back into NaN, so the sign of an infinity is lost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, NoReturn

import numpy as np

from latencylab.serve.types import DATATYPES, InferRequest, InferResponse, ProtocolError, Tensor, TensorSpec

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "OIP_DATATYPES",
    "check_requested_outputs",
    "encode_infer_response",
    "error_body",
    "model_metadata",
    "parse_infer_request",
    "server_metadata",
]

DEFAULT_MAX_ELEMENTS = 10_000_000

# Every datatype the protocol (with Triton's BF16) names; DATATYPES holds the ones this server can carry in JSON.
OIP_DATATYPES: tuple[str, ...] = (*DATATYPES, "BF16")

_BINARY_REFUSAL = "binary tensor extension not supported; send JSON data"
_INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
_NUMBER_TYPES = frozenset({int, float})
_MAX_SHOWN = 40  # characters of an offending value quoted in an error message


# ---------------------------------------------------------------------------------------------------------------------
# Requests


def parse_infer_request(
    body: bytes,
    model: str,
    version: str | None,
    specs: Sequence[TensorSpec],
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    *,
    headers: Mapping[str, str] | None = None,
) -> InferRequest:
    """Parse and validate an inference request body against the model's declared inputs.

    ``model`` and ``version`` come from the URL. Every input in ``specs`` is
    required and no other input is allowed; datatype and shape must match the
    spec (-1 matches any size, the rank must be equal). ``max_elements`` caps
    the total number of elements over all inputs (413 beyond it), checked
    before any data is converted. Pass the request ``headers`` so that a
    binary-extension request is refused by its header as well as by its body.

    The returned inputs are in ``specs`` order; ``outputs`` holds the requested
    output names (None: all). Requested names are *not* checked here, since the
    parser does not know the outputs: call :func:`check_requested_outputs`.
    """
    if headers is not None and any(key.lower() == "inference-header-content-length" for key in headers):
        raise ProtocolError(_BINARY_REFUSAL)
    doc = _loads(body)
    if not isinstance(doc, dict):
        raise ProtocolError(f"request body must be a JSON object, got {_json_type(doc)}")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise ProtocolError(f"'id' must be a string, got {_json_type(request_id)}")
    parameters = _parameters(doc.get("parameters"), "request 'parameters'")
    _check_deadline(parameters)
    outputs = _requested_outputs(doc.get("outputs"))

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError(
            f"'inputs' must be a JSON array, got {_json_type(raw_inputs)}"
            if "inputs" in doc
            else "request has no 'inputs'"
        )
    by_name = {spec.name: spec for spec in specs}
    checked: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {}
    total = 0
    # First pass: names, datatypes, shapes and the element budget, so an oversized request costs no conversion.
    for index, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise ProtocolError(f"inputs[{index}] must be a JSON object, got {_json_type(raw)}")
        name = raw.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f"inputs[{index}] has no 'name' string")
        spec = by_name.get(name)
        if spec is None:
            raise ProtocolError(f"unknown input {name!r} (model inputs: {_names(specs)})")
        if name in checked:
            raise ProtocolError(f"input {name!r} given twice")
        input_parameters = _parameters(raw.get("parameters"), f"input {name!r}: 'parameters'")
        if "binary_data_size" in input_parameters:
            raise ProtocolError(f"input {name!r}: {_BINARY_REFUSAL}")
        if "shared_memory_region" in input_parameters:
            raise ProtocolError(f"input {name!r}: shared-memory extension not supported; send JSON data")
        _check_datatype(name, raw.get("datatype"), spec)
        shape = _check_shape(name, raw.get("shape"), spec)
        total += math.prod(shape)
        checked[name] = (raw, shape)
    if total > max_elements:
        raise ProtocolError(f"request has {total} elements, more than the limit of {max_elements}", status=413)
    missing = [spec.name for spec in specs if spec.name not in checked]
    if missing:
        raise ProtocolError(f"missing required input {missing[0]!r} (model inputs: {_names(specs)})")

    tensors = []
    for spec in specs:
        raw, shape = checked[spec.name]
        if "data" not in raw:
            raise ProtocolError(f"input {spec.name!r}: no 'data'")
        flat = _flatten(spec.name, raw["data"], shape)
        array = _to_array(spec.name, spec.datatype, flat).reshape(shape)
        tensors.append(Tensor(spec.name, spec.datatype, shape, array))
    return InferRequest(
        model=model,
        version=version,
        inputs=tuple(tensors),
        id=request_id,
        parameters=parameters,
        outputs=outputs,
    )


def check_requested_outputs(requested: Sequence[str] | None, specs: Sequence[TensorSpec]) -> None:
    """Refuse (400) a request for an output the model does not declare; call it before running inference."""
    if requested is None:
        return
    known = {spec.name for spec in specs}
    for name in requested:
        if name not in known:
            raise ProtocolError(f"unknown output {name!r} (model outputs: {_names(specs)})")


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        if _looks_binary(body):
            raise ProtocolError(_BINARY_REFUSAL) from None
        raise ProtocolError("malformed JSON: body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        # A binary-extension body is a JSON header followed by raw tensor bytes: name the real cause.
        if exc.msg == "Extra data" and _looks_binary(body):
            raise ProtocolError(_BINARY_REFUSAL) from None
        raise ProtocolError(f"malformed JSON: {exc}") from None


def _looks_binary(body: bytes) -> bool:
    """Whether ``body`` starts with a JSON object whose inputs declare ``binary_data_size``."""
    try:
        head, _ = json.JSONDecoder().raw_decode(body.decode("utf-8", errors="replace"))
    except (json.JSONDecodeError, ValueError):
        return False
    inputs = head.get("inputs") if isinstance(head, dict) else None
    return isinstance(inputs, list) and any(
        isinstance(i, dict) and isinstance(i.get("parameters"), dict) and "binary_data_size" in i["parameters"]
        for i in inputs
    )


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be a JSON object, got {_json_type(raw)}")
    return raw


def _check_deadline(parameters: Mapping[str, Any]) -> None:
    if "deadline_ms" not in parameters:
        return
    value = parameters["deadline_ms"]
    if type(value) not in _NUMBER_TYPES or not math.isfinite(value) or value <= 0:
        raise ProtocolError(f"parameter 'deadline_ms' must be a positive number of milliseconds, got {_show(value)}")


def _requested_outputs(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ProtocolError(f"'outputs' must be a JSON array, got {_json_type(raw)}")
    names: list[str] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"outputs[{index}] must be a JSON object with a 'name' string")
        name = item["name"]
        if name in names:
            raise ProtocolError(f"output {name!r} requested twice")
        parameters = _parameters(item.get("parameters"), f"output {name!r}: 'parameters'")
        # "binary_data" (tritonclient's default) is a wish, not a requirement: outputs are always JSON.
        if "classification" in parameters:
            raise ProtocolError(f"output {name!r}: classification extension not supported")
        if "shared_memory_region" in parameters:
            raise ProtocolError(f"output {name!r}: shared-memory extension not supported")
        names.append(name)
    # An empty list asks for nothing in particular: like an absent one, it means every output.
    return tuple(names) or None


def _check_datatype(name: str, datatype: Any, spec: TensorSpec) -> None:
    if not isinstance(datatype, str) or datatype not in OIP_DATATYPES:
        raise ProtocolError(f"input {name!r}: unknown datatype {_show(datatype)} (one of {', '.join(OIP_DATATYPES)})")
    if datatype not in DATATYPES:
        raise ProtocolError(f"input {name!r}: datatype {datatype} cannot be sent as JSON data")
    if datatype != spec.datatype:
        raise ProtocolError(f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}")


def _check_shape(name: str, shape: Any, spec: TensorSpec) -> tuple[int, ...]:
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise ProtocolError(f"input {name!r}: 'shape' must be an array of non-negative integers, got {_show(shape)}")
    declared = list(spec.shape)
    if len(shape) != len(declared) or any(d != s and s != -1 for d, s in zip(shape, declared, strict=True)):
        raise ProtocolError(f"input {name!r}: shape {shape} does not match the model's {declared}")
    return tuple(shape)


def _flatten(name: str, data: Any, shape: tuple[int, ...]) -> list[Any]:
    """The row-major element list of ``data``, given flat or nested exactly as ``shape``."""
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: 'data' must be a JSON array, got {_json_type(data)}")
    expected = math.prod(shape)
    if not data or type(data[0]) is not list or not shape:
        if len(data) != expected:
            raise ProtocolError(
                f"input {name!r}: expected {expected} elements for shape {list(shape)}, got {len(data)}"
            )
        return data
    # Nested: each level must be a list as long as its dimension; the levels are joined one at a time.
    rows: list[Any] = [data]
    for depth, dim in enumerate(shape):
        for row in rows:
            if type(row) is not list or len(row) != dim:
                got = f"{len(row)} items" if type(row) is list else f"the element {_show(row)}"
                raise ProtocolError(
                    f"input {name!r}: nested data does not match shape {list(shape)}: "
                    f"expected {dim} items at depth {depth}, got {got}"
                )
        rows = list(chain.from_iterable(rows))
    return rows


def _to_array(name: str, datatype: str, flat: list[Any]) -> np.ndarray:
    """A 1-D numpy array of ``datatype`` from JSON values, refusing any element of the wrong kind or range."""
    types = set(map(type, flat))  # one C-speed pass decides the common, all-valid case
    if list in types:
        raise ProtocolError(f"input {name!r}: data is nested deeper than its shape, or mixes arrays and values")
    if datatype == "BYTES":
        if types - {str}:
            _raise_first_bad(name, flat, lambda v: type(v) is str, "expected a string")
        out = np.empty(len(flat), dtype=object)
        try:
            out[:] = [s.encode("utf-8") for s in flat]
        except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
            _raise_first_bad(name, flat, _encodable, "not valid Unicode (lone surrogate)")
        return out
    if datatype == "BOOL":
        if types - {bool}:
            _raise_first_bad(name, flat, lambda v: type(v) is bool, "expected a boolean (true/false)")
        return np.array(flat, dtype=np.bool_)
    dtype = np.dtype(DATATYPES[datatype])
    if types - _NUMBER_TYPES:
        what = "expected an integer" if datatype in _INT_TYPES else "expected a number"
        _raise_first_bad(name, flat, lambda v: type(v) in _NUMBER_TYPES, what)
    if not flat:
        return np.empty(0, dtype=dtype)
    if datatype in _INT_TYPES:
        if float in types and not all(map(_integral, flat)):
            _raise_first_bad(name, flat, _integral, "expected an integer")
        info = np.iinfo(dtype)
        if min(flat) < info.min or max(flat) > info.max:
            problem = f"out of range for {datatype} [{info.min}, {info.max}]"
            _raise_first_bad(name, flat, lambda v: info.min <= v <= info.max, problem)
        return np.array(flat, dtype=dtype)
    try:
        with np.errstate(over="ignore"):
            out = np.array(flat, dtype=dtype)
    except OverflowError:  # a Python int beyond float64's range
        _raise_first_bad(name, flat, _fits_float, f"out of range for {datatype}")
    if dtype != np.float64 and not np.isfinite(out).all():
        # Finite values too large for FP16/FP32 became infinities in the cast: refuse them, keep real NaN/Inf.
        overflow = np.isinf(out) & np.isfinite(np.array(flat, dtype=np.float64))
        if overflow.any():
            index = int(np.argmax(overflow))
            raise ProtocolError(f"input {name!r}: element {index} is {_show(flat[index])}, out of range for {datatype}")
    return out


def _raise_first_bad(name: str, flat: list[Any], ok: Any, problem: str) -> NoReturn:
    """Raise the 400 for the first element that fails ``ok``: "element 2 is 1.5, expected an integer"."""
    for index, value in enumerate(flat):
        if not ok(value):
            raise ProtocolError(f"input {name!r}: element {index} is {_show(value)}, {problem}")
    raise AssertionError("no offending element found")  # pragma: no cover - called only on a known failure


def _integral(value: int | float) -> bool:
    return isinstance(value, int) or value.is_integer()


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fits_float(value: int | float) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------------
# Responses and other bodies


def encode_infer_response(resp: InferResponse, requested: tuple[str, ...] | None = None) -> bytes:
    """The JSON body for ``resp``, with only the ``requested`` outputs (in that order) when given.

    Data is flat and row-major; BYTES elements are decoded as UTF-8 strings;
    non-finite floats become ``null``. An unknown requested name is a 400
    (:func:`check_requested_outputs` should have caught it before inference);
    an output that cannot be represented (undecodable BYTES, data that does
    not fit its declared datatype or shape) is a 500, since it is the server's
    fault. ``model_version`` is left out when ``resp.version`` is empty, as the
    protocol asks of servers without versions.
    """
    outputs: Sequence[Tensor] = resp.outputs
    if requested is not None:
        by_name = {t.name: t for t in resp.outputs}
        for name in requested:
            if name not in by_name:
                raise ProtocolError(f"unknown output {name!r} (model outputs: {_names(resp.outputs)})")
        outputs = [by_name[name] for name in requested]
    body: dict[str, Any] = {"model_name": resp.model}
    if resp.version:
        body["model_version"] = resp.version
    body["id"] = resp.id
    if resp.parameters:
        body["parameters"] = dict(resp.parameters)
    body["outputs"] = [_encode_tensor(t) for t in outputs]
    try:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:  # only response parameters can get here: tensors are converted above
        raise ProtocolError(f"response parameters are not JSON-serialisable: {exc}", status=500) from None
    return text.encode("utf-8")


def _encode_tensor(tensor: Tensor) -> dict[str, Any]:
    name, datatype = tensor.name, tensor.datatype
    if datatype not in DATATYPES:
        raise ProtocolError(f"output {name!r}: unknown datatype {datatype!r}", status=500)
    array = np.asarray(tensor.data)
    if array.shape != tuple(tensor.shape):
        raise ProtocolError(
            f"output {name!r}: data has shape {list(array.shape)}, declared {list(tensor.shape)}", status=500
        )
    flat = array.reshape(-1)
    data: list[Any]
    if datatype == "BYTES":
        data = [_decode(name, index, value) for index, value in enumerate(flat.tolist())]
    else:
        dtype = np.dtype(DATATYPES[datatype])
        if flat.dtype != dtype:
            try:
                cast = flat.astype(dtype)
            except (TypeError, ValueError) as exc:
                raise ProtocolError(
                    f"output {name!r}: {flat.dtype} data is not {datatype}: {exc}", status=500
                ) from None
            # Integers and booleans must survive the cast exactly; floats may lose precision (FP64 -> FP32).
            if datatype not in _FLOAT_TYPES and not np.array_equal(cast, flat):
                raise ProtocolError(f"output {name!r}: {flat.dtype} values do not fit {datatype}", status=500)
            flat = cast
        if datatype in _FLOAT_TYPES and not np.isfinite(flat).all():
            boxed = flat.astype(object)
            boxed[~np.isfinite(flat)] = None
            data = boxed.tolist()
        else:
            data = flat.tolist()
    return {"name": name, "datatype": datatype, "shape": list(tensor.shape), "data": data}


def _decode(name: str, index: int, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(
                f"output {name!r}: element {index} is not valid UTF-8 and cannot be sent as JSON", status=500
            ) from None
    raise ProtocolError(f"output {name!r}: element {index} is a {type(value).__name__}, not bytes", status=500)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def model_metadata(
    name: str,
    versions: Sequence[str],
    platform: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> dict[str, Any]:
    """The body of ``GET /v2/models/{name}``: name, versions, platform and the tensors' name/datatype/shape."""
    return {
        "name": name,
        "versions": list(versions),
        "platform": platform,
        "inputs": [spec.to_dict() for spec in inputs],
        "outputs": [spec.to_dict() for spec in outputs],
    }


def server_metadata(extensions: Sequence[str] = ()) -> dict[str, Any]:
    """The body of ``GET /v2``: this server's name and version and the protocol extensions it supports."""
    from latencylab import __version__

    return {"name": "latencylab", "version": __version__, "extensions": list(extensions)}


def error_body(message: str) -> bytes:
    """The protocol's error body, ``{"error": message}``."""
    return json.dumps({"error": message}).encode("utf-8")


# ---------------------------------------------------------------------------------------------------------------------
# Message helpers


def _names(tensors: Sequence[TensorSpec] | Sequence[Tensor]) -> str:
    return ", ".join(repr(t.name) for t in tensors) or "none"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _show(value: Any) -> str:
    """A value as it looked in the request (JSON), cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        if not _encodable(text):  # a lone surrogate would break logs: show it escaped
            text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
