"""Open Inference Protocol (KServe v2) HTTP codec: JSON tensors and the binary tensor data extension.

Turns request bodies into :class:`InferRequest` values and :class:`InferResponse`
values into response bodies, and builds the metadata and error bodies, exactly
as the protocol's HTTP/REST section describes them. No I/O happens here: the
app hands in bytes (and the request headers) and gets values back.

What the codec accepts and how it answers:

- Tensor ``data`` is a JSON array, either flat (row-major) or nested exactly
  as ``shape`` is (``[[1, 2], [3, 4]]`` for ``[2, 2]``); nesting that does not
  follow the shape is refused rather than guessed at.
- Elements must already have the declared type: JSON booleans for BOOL,
  integral numbers in the dtype's range for the integer types (``3.0`` is
  accepted as 3, ``1.5`` and ``true`` are not), numbers for FP16/32/64 (the
  JSON extensions ``NaN``/``Infinity`` that Python's and tritonclient's JSON
  encoders write are accepted), strings for BYTES (stored as UTF-8 ``bytes``).
- The binary tensor data extension (KServe/Triton; tritonclient's default) is
  supported both ways. A request whose body is a JSON object followed by raw
  tensor bytes says so with the ``Inference-Header-Content-Length`` header (the
  JSON's length); each binary input names its byte count in
  ``parameters.binary_data_size`` instead of giving ``data``, and the binary
  parts follow the JSON in the order the inputs are listed. Bytes are
  little-endian and row-major; BOOL is one byte (0 or 1) per element; a BYTES
  element is a 4-byte little-endian length and then its bytes. A size that
  disagrees with the shape and datatype, runs past the body or leaves bytes
  over is a 400. Outputs are answered as binary data when asked for
  (``parameters.binary_data`` on a requested output, else the request's
  ``parameters.binary_data_output``): see :func:`encode_infer_body`.
- The shared-memory and classification extensions are refused with a 400 that
  says so.
- Every refusal is a :class:`ProtocolError`: 400 with a one-line message that
  names the input, 413 when a request declares more elements than allowed.
  Bodies no JSON parser should be made to hold (nested more deeply than
  Python's recursion limit, integers of more than 4,300 digits) are 400s too.
- ``parameters.deadline_ms`` must be a number in (0, :data:`MAX_DEADLINE_MS`].
- Non-finite floats in JSON outputs (NaN, +Inf, -Inf) are encoded as JSON
  ``null`` so that the body stays valid JSON (RFC 8259 has no NaN);
  tritonclient's ``as_numpy`` turns ``null`` back into NaN, so the sign of an
  infinity is lost. Binary outputs carry them exactly.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NoReturn

import numpy as np

from latencylab.serve.types import DATATYPES, InferRequest, InferResponse, ProtocolError, Tensor, TensorSpec

__all__ = [
    "BINARY_HEADER",
    "DEFAULT_MAX_ELEMENTS",
    "MAX_DEADLINE_MS",
    "OIP_DATATYPES",
    "OutputFormat",
    "check_requested_outputs",
    "deadline_from_header",
    "decode_infer_request",
    "encode_infer_body",
    "encode_infer_response",
    "error_body",
    "model_metadata",
    "parse_infer_request",
    "server_metadata",
]

DEFAULT_MAX_ELEMENTS = 10_000_000
BINARY_HEADER = "Inference-Header-Content-Length"
# The longest deadline a request may ask for: 1 h. Longer is no deadline at all, and a bound keeps every
# conversion to integer nanoseconds (1e303 ms overflows one) well inside int64.
MAX_DEADLINE_MS = 3_600_000

# Every datatype the protocol (with Triton's BF16) names; DATATYPES holds the ones this server can carry.
OIP_DATATYPES: tuple[str, ...] = (*DATATYPES, "BF16")

_INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
_NUMBER_TYPES = frozenset({int, float})
_MAX_SHOWN = 40  # characters of an offending value quoted in an error message
_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix in binary data
_DECIMAL = re.compile(r"[0-9]{1,20}(?:\.[0-9]{0,20})?(?:[eE][+-]?[0-9]{1,4})?|\.[0-9]{1,20}(?:[eE][+-]?[0-9]{1,4})?")


# ---------------------------------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """How the client wants each output answered: binary tensor data or JSON.

    ``per_output`` holds the ``binary_data`` parameter of each requested output that gave one; every other
    output follows the request's ``binary_data_output`` (``default``), as the extension specifies."""

    default: bool = False
    per_output: Mapping[str, bool] = field(default_factory=dict)

    def binary(self, name: str) -> bool:
        return self.per_output.get(name, self.default)


_ALL_JSON = OutputFormat()


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
    before any data is converted. Pass the request ``headers``: a body with
    binary tensor data is told apart by its ``Inference-Header-Content-Length``.

    The returned inputs are in ``specs`` order; ``outputs`` holds the requested
    output names (None: all). Requested names are *not* checked here, since the
    parser does not know the outputs: call :func:`check_requested_outputs`.
    :func:`decode_infer_request` also returns how the outputs are to be sent.
    """
    return decode_infer_request(body, model, version, specs, max_elements, headers=headers)[0]


def decode_infer_request(
    body: bytes,
    model: str,
    version: str | None,
    specs: Sequence[TensorSpec],
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    *,
    headers: Mapping[str, str] | None = None,
) -> tuple[InferRequest, OutputFormat]:
    """:func:`parse_infer_request`, and the :class:`OutputFormat` the request asks for (binary or JSON)."""
    json_length = _json_length(headers, len(body))
    doc = _loads(body if json_length is None else body[:json_length])
    if not isinstance(doc, dict):
        raise ProtocolError(f"request body must be a JSON object, got {_json_type(doc)}")
    blob = memoryview(body)[json_length:] if json_length is not None else memoryview(b"")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise ProtocolError(f"'id' must be a string, got {_json_type(request_id)}")
    parameters = _parameters(doc.get("parameters"), "request 'parameters'")
    _check_deadline(parameters)
    default_binary = _flag(parameters, "binary_data_output", "request parameter")
    outputs, per_output = _requested_outputs(doc.get("outputs"))

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError(
            f"'inputs' must be a JSON array, got {_json_type(raw_inputs)}"
            if "inputs" in doc
            else "request has no 'inputs'"
        )
    by_name = {spec.name: spec for spec in specs}
    checked: dict[str, tuple[dict[str, Any], tuple[int, ...], int | None]] = {}
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
        if "shared_memory_region" in input_parameters:
            raise ProtocolError(f"input {name!r}: shared-memory extension not supported; send JSON or binary data")
        size = _binary_size(name, raw, input_parameters)
        _check_datatype(name, raw.get("datatype"), spec, binary=size is not None)
        shape = _check_shape(name, raw.get("shape"), spec, max_elements)
        if size is not None and spec.datatype != "BYTES":  # a BYTES tensor's size is known once it is read
            itemsize = np.dtype(DATATYPES[spec.datatype]).itemsize
            if size != math.prod(shape) * itemsize:
                raise ProtocolError(
                    f"input {name!r}: binary_data_size is {size} but {math.prod(shape)} {spec.datatype} elements "
                    f"take {math.prod(shape) * itemsize} bytes"
                )
        total += math.prod(shape)
        checked[name] = (raw, shape, size)
    if total > max_elements:
        raise ProtocolError(f"request has {total} elements, more than the limit of {max_elements}", status=413)
    missing = [spec.name for spec in specs if spec.name not in checked]
    if missing:
        raise ProtocolError(f"missing required input {missing[0]!r} (model inputs: {_names(specs)})")
    chunks = _binary_chunks(checked, blob, json_length)

    tensors = []
    for spec in specs:
        raw, shape, size = checked[spec.name]
        if size is not None:
            array = _from_binary(spec.name, spec.datatype, math.prod(shape), chunks[spec.name]).reshape(shape)
        elif "data" not in raw:
            raise ProtocolError(f"input {spec.name!r}: no 'data'")
        else:
            flat = _flatten(spec.name, raw["data"], shape)
            array = _to_array(spec.name, spec.datatype, flat).reshape(shape)
        tensors.append(Tensor(spec.name, spec.datatype, shape, array))
    request = InferRequest(
        model=model,
        version=version,
        inputs=tuple(tensors),
        id=request_id,
        parameters=parameters,
        outputs=outputs,
    )
    return request, OutputFormat(default_binary, per_output)


def check_requested_outputs(requested: Sequence[str] | None, specs: Sequence[TensorSpec]) -> None:
    """Refuse (400) a request for an output the model does not declare; call it before running inference."""
    if requested is None:
        return
    known = {spec.name for spec in specs}
    for name in requested:
        if name not in known:
            raise ProtocolError(f"unknown output {name!r} (model outputs: {_names(specs)})")


def deadline_from_header(text: str, header: str) -> float:
    """The deadline (ms) a request header states: a decimal number in (0, :data:`MAX_DEADLINE_MS`]."""
    value = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
    if not value > 0:  # NaN (not a number) too
        raise ProtocolError(f"header {header} must be a positive number of milliseconds, got {text[:40]!r}")
    if value > MAX_DEADLINE_MS:
        raise ProtocolError(f"header {header}: {text[:40]!r} ms is more than the maximum of {MAX_DEADLINE_MS} ms (1 h)")
    return value


def _json_length(headers: Mapping[str, str] | None, body_length: int) -> int | None:
    """The JSON part's length from ``Inference-Header-Content-Length`` (None: no header, the body is all JSON)."""
    if headers is None:
        return None
    key = BINARY_HEADER.lower()
    text = next((value for name, value in headers.items() if name.lower() == key), None)
    if text is None:
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or int(text) > body_length:
        raise ProtocolError(
            f"header {BINARY_HEADER} must be the JSON part's length in bytes, at most the body's {body_length}, "
            f"got {text[:40]!r}"
        )
    return int(text)


def _loads(body: bytes | memoryview) -> Any:
    try:
        return json.loads(bytes(body))
    except UnicodeDecodeError:
        if _looks_binary(body):
            raise ProtocolError(_NO_HEADER) from None
        raise ProtocolError("malformed JSON: body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        # A binary-extension body is a JSON header followed by raw tensor bytes: name the real cause.
        if exc.msg == "Extra data" and _looks_binary(body):
            raise ProtocolError(_NO_HEADER) from None
        raise ProtocolError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("malformed JSON: nested too deeply") from None
    except ValueError:  # an integer literal beyond Python's int-string limit
        limit = sys.get_int_max_str_digits()
        raise ProtocolError(f"malformed JSON: an integer literal has more than {limit} digits") from None


_NO_HEADER = f"the body has binary tensor data after its JSON: send the {BINARY_HEADER} header with the JSON's length"


def _looks_binary(body: bytes | memoryview) -> bool:
    """Whether ``body`` starts with a JSON object whose inputs declare ``binary_data_size``."""
    try:
        head, _ = json.JSONDecoder().raw_decode(bytes(body).decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
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


def _flag(parameters: Mapping[str, Any], key: str, where: str) -> bool:
    value = parameters.get(key, False)
    if type(value) is not bool:
        raise ProtocolError(f"{where} {key!r} must be true or false, got {_show(value)}")
    return value


def _check_deadline(parameters: Mapping[str, Any]) -> None:
    if "deadline_ms" not in parameters:
        return
    value = parameters["deadline_ms"]
    # Compared, never converted: a 400-digit integer or 1e303 must not reach a float or an int64 conversion.
    if type(value) not in _NUMBER_TYPES or not value > 0 or value == math.inf:  # NaN fails "> 0"
        raise ProtocolError(f"parameter 'deadline_ms' must be a positive number of milliseconds, got {_show(value)}")
    if value > MAX_DEADLINE_MS:
        raise ProtocolError(
            f"parameter 'deadline_ms' is {_show(value)} ms, more than the maximum of {MAX_DEADLINE_MS} ms (1 h)"
        )


def _requested_outputs(raw: Any) -> tuple[tuple[str, ...] | None, dict[str, bool]]:
    if raw is None:
        return None, {}
    if not isinstance(raw, list):
        raise ProtocolError(f"'outputs' must be a JSON array, got {_json_type(raw)}")
    names: list[str] = []
    binary: dict[str, bool] = {}
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"outputs[{index}] must be a JSON object with a 'name' string")
        name = item["name"]
        if name in names:
            raise ProtocolError(f"output {name!r} requested twice")
        parameters = _parameters(item.get("parameters"), f"output {name!r}: 'parameters'")
        if "classification" in parameters:
            raise ProtocolError(f"output {name!r}: classification extension not supported")
        if "shared_memory_region" in parameters:
            raise ProtocolError(f"output {name!r}: shared-memory extension not supported")
        if "binary_data" in parameters:
            binary[name] = _flag(parameters, "binary_data", f"output {name!r}: parameter")
        names.append(name)
    # An empty list asks for nothing in particular: like an absent one, it means every output.
    return tuple(names) or None, binary


def _binary_size(name: str, raw: Mapping[str, Any], parameters: Mapping[str, Any]) -> int | None:
    if "binary_data_size" not in parameters:
        return None
    size = parameters["binary_data_size"]
    if type(size) is not int or size < 0:
        raise ProtocolError(f"input {name!r}: 'binary_data_size' must be a non-negative integer, got {_show(size)}")
    if "data" in raw:
        raise ProtocolError(f"input {name!r}: give either 'data' or parameters.binary_data_size, not both")
    return size


def _check_datatype(name: str, datatype: Any, spec: TensorSpec, binary: bool = False) -> None:
    if not isinstance(datatype, str) or datatype not in OIP_DATATYPES:
        raise ProtocolError(f"input {name!r}: unknown datatype {_show(datatype)} (one of {', '.join(OIP_DATATYPES)})")
    if datatype not in DATATYPES:  # BF16: numpy has no such type
        problem = "is not supported by this server" if binary else "cannot be sent as JSON data"
        raise ProtocolError(f"input {name!r}: datatype {datatype} {problem}")
    if datatype != spec.datatype:
        raise ProtocolError(f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}")


def _check_shape(name: str, shape: Any, spec: TensorSpec, max_elements: int) -> tuple[int, ...]:
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise ProtocolError(f"input {name!r}: 'shape' must be an array of non-negative integers, got {_show(shape)}")
    declared = list(spec.shape)
    if len(shape) != len(declared) or any(d != s and s != -1 for d, s in zip(shape, declared, strict=True)):
        raise ProtocolError(f"input {name!r}: shape {_show(shape)} does not match the model's {declared}")
    # One dimension beyond the element budget is refused even when another is 0 (no elements at all): numpy
    # cannot make an array with a dimension past int64.
    if any(d > max_elements for d in shape):
        raise ProtocolError(
            f"input {name!r}: shape {_show(shape)} has a dimension over the limit of {max_elements} elements", 413
        )
    return tuple(shape)


def _binary_chunks(
    checked: Mapping[str, tuple[dict[str, Any], tuple[int, ...], int | None]],
    blob: memoryview,
    json_length: int | None,
) -> dict[str, memoryview]:
    """Each binary input's bytes, cut from ``blob`` in the order the request lists the inputs."""
    sizes = [(name, size) for name, (_, _, size) in checked.items() if size is not None]
    if sizes and json_length is None:
        raise ProtocolError(f"input {sizes[0][0]!r} has binary_data_size but the request has no {BINARY_HEADER} header")
    chunks: dict[str, memoryview] = {}
    offset = 0
    for name, size in sizes:
        if offset + size > len(blob):
            raise ProtocolError(
                f"input {name!r}: binary_data_size {size} runs past the end of the body "
                f"({len(blob) - offset} bytes of binary data left)"
            )
        chunks[name] = blob[offset : offset + size]
        offset += size
    if offset != len(blob):
        raise ProtocolError(
            f"the body has {len(blob) - offset} bytes after the binary tensor data the inputs declare "
            f"({offset} bytes; {BINARY_HEADER} says the JSON is the first {json_length})"
        )
    return chunks


def _from_binary(name: str, datatype: str, count: int, chunk: memoryview) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``datatype`` from the extension's binary layout (``chunk``)."""
    if datatype == "BYTES":
        return _bytes_elements(name, count, chunk)
    dtype = np.dtype(DATATYPES[datatype])  # the size was checked against the shape in the first pass
    if datatype == "BOOL":
        raw = np.frombuffer(chunk, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            index = int(np.argmax(raw > 1))
            raise ProtocolError(f"input {name!r}: element {index} is byte {raw[index]}, expected 0 or 1 for BOOL")
        return raw.astype(np.bool_)
    # Little-endian on the wire; astype copies into native order, so the array owns its memory (not the body's).
    return np.frombuffer(chunk, dtype=dtype.newbyteorder("<")).astype(dtype)


def _bytes_elements(name: str, count: int, chunk: memoryview) -> np.ndarray:
    size = len(chunk)
    if count * _LENGTH.size > size:  # every element has a 4-byte length: refuse before looping
        raise ProtocolError(
            f"input {name!r}: binary_data_size is {size}, too small for {count} BYTES elements (4 bytes of length each)"
        )
    data = bytes(chunk)
    out = np.empty(count, dtype=object)
    pos = 0
    for index in range(count):
        if pos + _LENGTH.size > size:
            raise ProtocolError(f"input {name!r}: binary data ends inside element {index}'s length")
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        if pos + length > size:
            raise ProtocolError(
                f"input {name!r}: element {index} declares {length} bytes, but only {size - pos} are left"
            )
        out[index] = data[pos : pos + length]
        pos += length
    if pos != size:
        raise ProtocolError(
            f"input {name!r}: binary_data_size is {size} but its {count} BYTES elements take {pos} bytes"
        )
    return out


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
    """The all-JSON body for ``resp``, with only the ``requested`` outputs (in that order) when given.

    Data is flat and row-major; BYTES elements are decoded as UTF-8 strings;
    non-finite floats become ``null``. An unknown requested name is a 400
    (:func:`check_requested_outputs` should have caught it before inference);
    an output that cannot be represented (undecodable BYTES, data that does
    not fit its declared datatype or shape) is a 500, since it is the server's
    fault. ``model_version`` is left out when ``resp.version`` is empty, as the
    protocol asks of servers without versions.
    """
    return encode_infer_body(resp, requested)[0]


def encode_infer_body(
    resp: InferResponse, requested: tuple[str, ...] | None = None, output_format: OutputFormat = _ALL_JSON
) -> tuple[bytes, int | None]:
    """The body for ``resp`` with the outputs ``output_format`` asks for as binary tensor data, and the length
    of its JSON part for the ``Inference-Header-Content-Length`` header (None when every output is JSON: then
    the body is all JSON and the header must be left out).

    A binary output's JSON has ``parameters.binary_data_size`` and no ``data``; its bytes follow the JSON in
    output order, in the layout the requests use (little-endian, BYTES length-prefixed, BOOL one byte). Binary
    data carries what JSON cannot: NaN and infinities exactly, BYTES that are not UTF-8. Otherwise as
    :func:`encode_infer_response`.
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
    encoded: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in outputs:
        if output_format.binary(tensor.name):
            head, blob = _encode_binary_tensor(tensor)
            encoded.append(head)
            blobs.append(blob)
        else:
            encoded.append(_encode_tensor(tensor))
    body["outputs"] = encoded
    try:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:  # only response parameters can get here: tensors are converted above
        raise ProtocolError(f"response parameters are not JSON-serialisable: {exc}", status=500) from None
    head_bytes = text.encode("utf-8")
    if not blobs:
        return head_bytes, None
    return b"".join([head_bytes, *blobs]), len(head_bytes)


def _output_flat(tensor: Tensor) -> np.ndarray:
    """The output's data, flat and in its declared datatype (object array for BYTES); 500 if it does not fit."""
    name, datatype = tensor.name, tensor.datatype
    if datatype not in DATATYPES:
        raise ProtocolError(f"output {name!r}: unknown datatype {datatype!r}", status=500)
    array = np.asarray(tensor.data)
    if array.shape != tuple(tensor.shape):
        raise ProtocolError(
            f"output {name!r}: data has shape {list(array.shape)}, declared {list(tensor.shape)}", status=500
        )
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return flat
    dtype = np.dtype(DATATYPES[datatype])
    if flat.dtype != dtype:
        try:
            cast = flat.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"output {name!r}: {flat.dtype} data is not {datatype}: {exc}", status=500) from None
        # Integers and booleans must survive the cast exactly; floats may lose precision (FP64 -> FP32).
        if datatype not in _FLOAT_TYPES and not np.array_equal(cast, flat):
            raise ProtocolError(f"output {name!r}: {flat.dtype} values do not fit {datatype}", status=500)
        flat = cast
    return flat


def _encode_tensor(tensor: Tensor) -> dict[str, Any]:
    flat = _output_flat(tensor)
    data: list[Any]
    if tensor.datatype == "BYTES":
        data = [_decode(tensor.name, index, value) for index, value in enumerate(flat.tolist())]
    elif tensor.datatype in _FLOAT_TYPES and not np.isfinite(flat).all():
        boxed = flat.astype(object)
        boxed[~np.isfinite(flat)] = None
        data = boxed.tolist()
    else:
        data = flat.tolist()
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape), "data": data}


def _encode_binary_tensor(tensor: Tensor) -> tuple[dict[str, Any], bytes]:
    flat = _output_flat(tensor)
    if tensor.datatype == "BYTES":
        parts: list[bytes] = []
        for index, value in enumerate(flat.tolist()):
            element = _element_bytes(tensor.name, index, value)
            parts += (_LENGTH.pack(len(element)), element)
        blob = b"".join(parts)
    else:
        blob = flat.astype(flat.dtype.newbyteorder("<"), copy=False).tobytes()
    head = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "parameters": {"binary_data_size": len(blob)},
    }
    return head, blob


def _element_bytes(name: str, index: int, value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogatepass")
    raise ProtocolError(f"output {name!r}: element {index} is a {type(value).__name__}, not bytes", status=500)


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
    except (TypeError, ValueError, RecursionError):  # not JSON, too deep, or an int too long to print
        text = f"<{_json_type(value)}>"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
