"""The built-in vision variant: BYTES JPEGs -> the digits CNN's class probabilities and top class.

Decoding, resizing and normalising are the vision workload's own functions (``decode``, ``Preprocess``), so
what the server computes for a request is what the ``vision`` workload computes for the same input. The ONNX
Runtime rung (serve/ort_vision.py) reuses all of it but the forward call. Which rungs exist, and how they are
built: serve/variants.py.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab.device import check_device
from latencylab.errors import LatencyLabError
from latencylab.serve.types import InferRequest, ProtocolError, Tensor, TensorSpec
from latencylab.serve.variants_base import (
    bytes_elements,
    bytes_tensor,
    check_kind,
    check_max_batch_size,
    check_warmup_sizes,
    split_counts,
    torch_module,
)

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_IMAGE_PIXELS", "VisionBatch", "VisionVariant"]

# Bigger images are refused before decoding: a 40-byte header can claim a gigapixel.
MAX_IMAGE_PIXELS = 4096 * 4096


@dataclass(frozen=True, slots=True)
class VisionBatch:
    """What ``VisionVariant.forward`` returns: per-row probabilities and classes, and rows per request."""

    probs: np.ndarray  # (rows, classes) float32
    class_ids: np.ndarray  # (rows,) int64
    counts: tuple[int, ...]


class VisionVariant:
    """An image classifier variant: BYTES JPEGs -> class probabilities and the top class.

    Each ``IMAGE`` element is an image file's bytes, as base64 text (standard
    alphabet; what OIP's JSON form carries) or raw (as the binary extension
    carries; recognised by the JPEG start-of-image marker). Decoding, resizing
    to ``res`` x ``res`` and normalising are the vision workload's own
    functions, so server and workload compute the same inputs.
    """

    model_name = "vision"

    def __init__(
        self,
        name: str,
        kind: str,
        model: Any,
        res: int,
        *,
        max_batch_size: int = 8,
        device: str = "cpu",
        description: str = "",
        n_classes: int = 10,
    ) -> None:
        from latencylab.workloads import vision

        check_kind(kind)
        if res < 1:
            raise LatencyLabError(f"res must be >= 1, got {res}")
        self.name = name
        self.kind = kind
        self.res = int(res)
        self.max_batch_size = check_max_batch_size(max_batch_size)
        self.device = check_device(device)
        self.description = description
        self.module = model.to(self.device).eval()
        self._preprocess = vision.Preprocess(self.res)
        self._forward = vision.Forward(self.module)
        self.inputs: tuple[TensorSpec, ...] = (TensorSpec("IMAGE", "BYTES", (-1,)),)
        self.outputs: tuple[TensorSpec, ...] = (
            TensorSpec("PROBABILITIES", "FP32", (-1, n_classes)),
            TensorSpec("CLASS", "INT64", (-1,)),
        )

    def __repr__(self) -> str:
        return f"VisionVariant(name={self.name!r}, kind={self.kind!r}, res={self.res}, device={self.device!r})"

    def preprocess(self, request: InferRequest) -> torch.Tensor:
        """Decode each image of input ``IMAGE`` -> one float32 (images, 3, res, res) CPU tensor."""
        from latencylab.workloads import vision

        arrays = []
        for i, el in enumerate(bytes_elements(request, "IMAGE", self.max_batch_size)):
            data = _image_bytes(el, i)
            _check_image_size(data, i)
            try:
                arrays.extend(vision.decode(data))
            except LatencyLabError as exc:
                raise ProtocolError(f"IMAGE[{i}]: {exc}") from None
        return self._preprocess(arrays)

    def forward(self, items: Sequence[torch.Tensor]) -> VisionBatch:
        """Classify every image of every item in one model call."""
        from latencylab.workloads import vision

        torch = torch_module()
        counts = tuple(int(x.shape[0]) for x in items)
        x = items[0] if len(items) == 1 else torch.cat(list(items))
        preds = vision.postprocess(self._forward(x.to(self.device)))
        return VisionBatch(
            np.asarray(preds.probs, dtype=np.float32), np.asarray(preds.class_ids, dtype=np.int64), counts
        )

    def postprocess(self, raw: VisionBatch, n: int) -> list[tuple[Tensor, ...]]:
        """``PROBABILITIES`` (images, classes) and ``CLASS`` (images,) per request, in the order of the items."""
        out: list[tuple[Tensor, ...]] = []
        for start, stop in split_counts(raw.counts, n):
            probs = raw.probs[start:stop].copy()
            ids = raw.class_ids[start:stop].copy()
            out.append((Tensor("PROBABILITIES", "FP32", probs.shape, probs), Tensor("CLASS", "INT64", ids.shape, ids)))
        return out

    def warmup_items(self, n: int) -> list[Any]:
        """``n`` preprocessed items of a synthetic one-image request (for warm-up and compute timing)."""
        request = InferRequest(self.model_name, None, (bytes_tensor("IMAGE", [base64.b64encode(_synthetic_jpeg())]),))
        return [self.preprocess(request) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Run every stage twice at each batch size on a synthetic one-image request (base64 JPEG)."""
        for bs in check_warmup_sizes(batch_sizes, self.max_batch_size):
            for _ in range(2):
                self.postprocess(self.forward(self.warmup_items(bs)), bs)


def _image_bytes(el: Any, i: int) -> bytes:
    """An IMAGE element's image file bytes: raw JPEG bytes pass through, base64 text is decoded."""
    if isinstance(el, str):
        try:
            el = el.encode("ascii")
        except UnicodeEncodeError:
            raise ProtocolError(f"IMAGE[{i}] is not base64: it contains non-ASCII characters") from None
    if not isinstance(el, bytes | bytearray | memoryview):
        raise ProtocolError(f"IMAGE[{i}] must be base64 text or image bytes, got {type(el).__name__}")
    data = bytes(el)
    if data.startswith(b"\xff\xd8"):  # a JPEG's start-of-image marker can never begin base64 text
        return data
    try:
        # Line breaks (MIME-style wrapping) are tolerated; any other character outside the alphabet is not.
        decoded = base64.b64decode(b"".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"IMAGE[{i}] is not valid base64 (standard alphabet, padded): {exc}") from None
    if not decoded:
        raise ProtocolError(f"IMAGE[{i}] is empty")
    return decoded


def _check_image_size(data: bytes, i: int) -> None:
    """Refuse unreadable files and over-large images from the header alone, before decoding pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ProtocolError(f"IMAGE[{i}] is not a decodable image ({type(exc).__name__}: {exc})") from None
    if w * h > MAX_IMAGE_PIXELS:
        raise ProtocolError(f"IMAGE[{i}] is {w}x{h} pixels; the limit is {MAX_IMAGE_PIXELS} pixels")


def _synthetic_jpeg(side: int = 224) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()
