"""Open Inference Protocol tensor data: JSON elements and the binary extension's layout <-> numpy arrays.

Requests (serve/protocol_request.py): JSON ``data`` (flat or nested as the shape) becomes a 1-D array of
the declared datatype, refusing any element of the wrong kind or range with a 400 that names it
("element 2 is 1.5, expected an integer"); binary data is cut into elements (little-endian, BOOL one byte,
BYTES length-prefixed). Responses (serve/protocol_response.py) write the same layout. The message helpers
quote a value as it looked in the request.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any, NoReturn

import numpy as np

from latencylab.serve.types import DATATYPES, ProtocolError, Tensor, TensorSpec

__all__ = [
    "BYTES_LENGTH",
    "FLOAT_TYPES",
    "INT_TYPES",
    "NUMBER_TYPES",
    "flatten",
    "from_binary",
    "json_type",
    "quote",
    "tensor_names",
    "to_array",
]

INT_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
NUMBER_TYPES = frozenset({int, float})
_MAX_SHOWN = 40  # characters of an offending value quoted in an error message
BYTES_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix in binary data


def from_binary(name: str, datatype: str, count: int, chunk: memoryview) -> np.ndarray:
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
    if count * BYTES_LENGTH.size > size:  # every element has a 4-byte length: refuse before looping
        raise ProtocolError(
            f"input {name!r}: binary_data_size is {size}, too small for {count} BYTES elements (4 bytes of length each)"
        )
    data = bytes(chunk)
    out = np.empty(count, dtype=object)
    pos = 0
    for index in range(count):
        if pos + BYTES_LENGTH.size > size:
            raise ProtocolError(f"input {name!r}: binary data ends inside element {index}'s length")
        (length,) = BYTES_LENGTH.unpack_from(data, pos)
        pos += BYTES_LENGTH.size
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


def flatten(name: str, data: Any, shape: tuple[int, ...]) -> list[Any]:
    """The row-major element list of ``data``, given flat or nested exactly as ``shape``."""
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: 'data' must be a JSON array, got {json_type(data)}")
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
                got = f"{len(row)} items" if type(row) is list else f"the element {quote(row)}"
                raise ProtocolError(
                    f"input {name!r}: nested data does not match shape {list(shape)}: "
                    f"expected {dim} items at depth {depth}, got {got}"
                )
        rows = list(chain.from_iterable(rows))
    return rows


def to_array(name: str, datatype: str, flat: list[Any]) -> np.ndarray:
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
    if types - NUMBER_TYPES:
        what = "expected an integer" if datatype in INT_TYPES else "expected a number"
        _raise_first_bad(name, flat, lambda v: type(v) in NUMBER_TYPES, what)
    if not flat:
        return np.empty(0, dtype=dtype)
    if datatype in INT_TYPES:
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
            raise ProtocolError(f"input {name!r}: element {index} is {quote(flat[index])}, out of range for {datatype}")
    return out


def _raise_first_bad(name: str, flat: list[Any], ok: Any, problem: str) -> NoReturn:
    """Raise the 400 for the first element that fails ``ok``: "element 2 is 1.5, expected an integer"."""
    for index, value in enumerate(flat):
        if not ok(value):
            raise ProtocolError(f"input {name!r}: element {index} is {quote(value)}, {problem}")
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
# Message helpers


def tensor_names(tensors: Sequence[TensorSpec] | Sequence[Tensor]) -> str:
    return ", ".join(repr(t.name) for t in tensors) or "none"


def json_type(value: Any) -> str:
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


def quote(value: Any) -> str:
    """A value as it looked in the request (JSON), cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        if not _encodable(text):  # a lone surrogate would break logs: show it escaped
            text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):  # not JSON, too deep, or an int too long to print
        text = f"<{json_type(value)}>"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
