"""Open Inference Protocol (KServe v2) HTTP codec, responses: an :class:`InferResponse` -> a response body;
and the metadata and error bodies.

Outputs are JSON unless the request asked for binary tensor data (:class:`OutputFormat`, read from the
request by serve/protocol_request.py); binary outputs follow the JSON in the layout requests use
(serve/protocol_tensors.py). No I/O happens here.

- Non-finite floats in JSON outputs (NaN, +Inf, -Inf) are encoded as JSON
  ``null`` so that the body stays valid JSON (RFC 8259 has no NaN);
  tritonclient's ``as_numpy`` turns ``null`` back into NaN, so the sign of an
  infinity is lost. Binary outputs carry them exactly.
- An output the server cannot represent is a :class:`ProtocolError` with status 500: it is the server's
  fault, not the client's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab.serve.protocol_request import OutputFormat
from latencylab.serve.protocol_tensors import BYTES_LENGTH, FLOAT_TYPES, tensor_names
from latencylab.serve.types import DATATYPES, InferResponse, ProtocolError, Tensor, TensorSpec

__all__ = ["encode_infer_body", "encode_infer_response", "error_body", "model_metadata", "server_metadata"]

_ALL_JSON = OutputFormat()


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
                raise ProtocolError(f"unknown output {name!r} (model outputs: {tensor_names(resp.outputs)})")
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
        if datatype not in FLOAT_TYPES and not np.array_equal(cast, flat):
            raise ProtocolError(f"output {name!r}: {flat.dtype} values do not fit {datatype}", status=500)
        flat = cast
    return flat


def _encode_tensor(tensor: Tensor) -> dict[str, Any]:
    flat = _output_flat(tensor)
    data: list[Any]
    if tensor.datatype == "BYTES":
        data = [_decode(tensor.name, index, value) for index, value in enumerate(flat.tolist())]
    elif tensor.datatype in FLOAT_TYPES and not np.isfinite(flat).all():
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
            parts += (BYTES_LENGTH.pack(len(element)), element)
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
