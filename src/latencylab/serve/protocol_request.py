"""Open Inference Protocol (KServe v2) HTTP codec, requests: a request body -> a validated :class:`InferRequest`.

Turns request bodies (and their headers) into :class:`InferRequest` values exactly as the protocol's HTTP/REST
section describes them, with the binary tensor data extension. No I/O happens here: the app hands in bytes
and gets values back. Converting the tensors' elements (JSON values or binary data) is
serve/protocol_tensors.py; the response, metadata and error bodies are serve/protocol_response.py.

What the codec accepts:

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
  ``parameters.binary_data_output``): see :class:`OutputFormat` and
  serve/protocol_response.py.
- The shared-memory and classification extensions are refused with a 400 that
  says so.
- Every refusal is a :class:`ProtocolError`: 400 with a one-line message that
  names the input, 413 when a request declares more elements than allowed.
  Bodies no JSON parser should be made to hold (nested more deeply than
  Python's recursion limit, integers of more than 4,300 digits) are 400s too.
- ``parameters.deadline_ms`` must be a number in (0, :data:`MAX_DEADLINE_MS`].
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.serve.protocol_tensors import (
    NUMBER_TYPES,
    flatten,
    from_binary,
    json_type,
    quote,
    tensor_names,
    to_array,
)
from latencylab.serve.types import DATATYPES, InferRequest, ProtocolError, Tensor, TensorSpec

__all__ = [
    "BINARY_HEADER",
    "DEFAULT_MAX_ELEMENTS",
    "MAX_DEADLINE_MS",
    "OIP_DATATYPES",
    "OutputFormat",
    "check_requested_outputs",
    "deadline_from_header",
    "decode_infer_request",
    "parse_infer_request",
]

DEFAULT_MAX_ELEMENTS = 10_000_000
BINARY_HEADER = "Inference-Header-Content-Length"
# The longest deadline a request may ask for: 1 h. Longer is no deadline at all, and a bound keeps every
# conversion to integer nanoseconds (1e303 ms overflows one) well inside int64.
MAX_DEADLINE_MS = 3_600_000

# Every datatype the protocol (with Triton's BF16) names; DATATYPES holds the ones this server can carry.
OIP_DATATYPES: tuple[str, ...] = (*DATATYPES, "BF16")

_DECIMAL = re.compile(r"[0-9]{1,20}(?:\.[0-9]{0,20})?(?:[eE][+-]?[0-9]{1,4})?|\.[0-9]{1,20}(?:[eE][+-]?[0-9]{1,4})?")


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """How the client wants each output answered: binary tensor data or JSON.

    ``per_output`` holds the ``binary_data`` parameter of each requested output that gave one; every other
    output follows the request's ``binary_data_output`` (``default``), as the extension specifies."""

    default: bool = False
    per_output: Mapping[str, bool] = field(default_factory=dict)

    def binary(self, name: str) -> bool:
        return self.per_output.get(name, self.default)


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
        raise ProtocolError(f"request body must be a JSON object, got {json_type(doc)}")
    blob = memoryview(body)[json_length:] if json_length is not None else memoryview(b"")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise ProtocolError(f"'id' must be a string, got {json_type(request_id)}")
    parameters = _parameters(doc.get("parameters"), "request 'parameters'")
    _check_deadline(parameters)
    default_binary = _flag(parameters, "binary_data_output", "request parameter")
    outputs, per_output = _requested_outputs(doc.get("outputs"))

    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError(
            f"'inputs' must be a JSON array, got {json_type(raw_inputs)}"
            if "inputs" in doc
            else "request has no 'inputs'"
        )
    by_name = {spec.name: spec for spec in specs}
    checked: dict[str, tuple[dict[str, Any], tuple[int, ...], int | None]] = {}
    total = 0
    # First pass: names, datatypes, shapes and the element budget, so an oversized request costs no conversion.
    for index, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise ProtocolError(f"inputs[{index}] must be a JSON object, got {json_type(raw)}")
        name = raw.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f"inputs[{index}] has no 'name' string")
        spec = by_name.get(name)
        if spec is None:
            raise ProtocolError(f"unknown input {name!r} (model inputs: {tensor_names(specs)})")
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
        raise ProtocolError(f"missing required input {missing[0]!r} (model inputs: {tensor_names(specs)})")
    chunks = _binary_chunks(checked, blob, json_length)

    tensors = []
    for spec in specs:
        raw, shape, size = checked[spec.name]
        if size is not None:
            array = from_binary(spec.name, spec.datatype, math.prod(shape), chunks[spec.name]).reshape(shape)
        elif "data" not in raw:
            raise ProtocolError(f"input {spec.name!r}: no 'data'")
        else:
            flat = flatten(spec.name, raw["data"], shape)
            array = to_array(spec.name, spec.datatype, flat).reshape(shape)
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
            raise ProtocolError(f"unknown output {name!r} (model outputs: {tensor_names(specs)})")


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
        raise ProtocolError(f"{where} must be a JSON object, got {json_type(raw)}")
    return raw


def _flag(parameters: Mapping[str, Any], key: str, where: str) -> bool:
    value = parameters.get(key, False)
    if type(value) is not bool:
        raise ProtocolError(f"{where} {key!r} must be true or false, got {quote(value)}")
    return value


def _check_deadline(parameters: Mapping[str, Any]) -> None:
    if "deadline_ms" not in parameters:
        return
    value = parameters["deadline_ms"]
    # Compared, never converted: a 400-digit integer or 1e303 must not reach a float or an int64 conversion.
    if type(value) not in NUMBER_TYPES or not value > 0 or value == math.inf:  # NaN fails "> 0"
        raise ProtocolError(f"parameter 'deadline_ms' must be a positive number of milliseconds, got {quote(value)}")
    if value > MAX_DEADLINE_MS:
        raise ProtocolError(
            f"parameter 'deadline_ms' is {quote(value)} ms, more than the maximum of {MAX_DEADLINE_MS} ms (1 h)"
        )


def _requested_outputs(raw: Any) -> tuple[tuple[str, ...] | None, dict[str, bool]]:
    if raw is None:
        return None, {}
    if not isinstance(raw, list):
        raise ProtocolError(f"'outputs' must be a JSON array, got {json_type(raw)}")
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
        raise ProtocolError(f"input {name!r}: 'binary_data_size' must be a non-negative integer, got {quote(size)}")
    if "data" in raw:
        raise ProtocolError(f"input {name!r}: give either 'data' or parameters.binary_data_size, not both")
    return size


def _check_datatype(name: str, datatype: Any, spec: TensorSpec, binary: bool = False) -> None:
    if not isinstance(datatype, str) or datatype not in OIP_DATATYPES:
        raise ProtocolError(f"input {name!r}: unknown datatype {quote(datatype)} (one of {', '.join(OIP_DATATYPES)})")
    if datatype not in DATATYPES:  # BF16: numpy has no such type
        problem = "is not supported by this server" if binary else "cannot be sent as JSON data"
        raise ProtocolError(f"input {name!r}: datatype {datatype} {problem}")
    if datatype != spec.datatype:
        raise ProtocolError(f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}")


def _check_shape(name: str, shape: Any, spec: TensorSpec, max_elements: int) -> tuple[int, ...]:
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise ProtocolError(f"input {name!r}: 'shape' must be an array of non-negative integers, got {quote(shape)}")
    declared = list(spec.shape)
    if len(shape) != len(declared) or any(d != s and s != -1 for d, s in zip(shape, declared, strict=True)):
        raise ProtocolError(f"input {name!r}: shape {quote(shape)} does not match the model's {declared}")
    # One dimension beyond the element budget is refused even when another is 0 (no elements at all): numpy
    # cannot make an array with a dimension past int64.
    if any(d > max_elements for d in shape):
        raise ProtocolError(
            f"input {name!r}: shape {quote(shape)} has a dimension over the limit of {max_elements} elements", 413
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
