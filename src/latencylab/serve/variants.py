"""Servable variants of the built-in models: the rungs of the server's fallback ladder.

Each model has a ladder of variants, in the order the SLO guard steps down it::

    model   primary                        lighter                      quantized (int8)
    text    "fp32-onnx": all-MiniLM-L6-v2  "trunc64": inputs cut at 64  torch dynamic INT8 Linear layers
            FP32 on ONNX Runtime (CPU)
    vision  "fp32": digits CNN at 64x64    "res32": same CNN at 32x32   dynamic INT8 classifier (convs stay FP32)

A variant implements :class:`latencylab.serve.types.Variant`: ``preprocess``
turns one request into an item (and refuses bad content with a 400
:class:`ProtocolError`), ``forward`` runs a batch of items in one model call,
``postprocess`` splits the batch's output back into one tuple of tensors per
request, and ``warmup`` pays the first-call costs before traffic arrives.

Preprocessing reuses the workloads' own functions (the text tokenizer, the
vision workload's ``decode`` and ``Preprocess``), so what the server computes
for a request is what the ``text`` and ``vision`` workloads compute for the
same input.

Fidelity, measured over the whole shipped corpus (600 texts) and the 360
held-out JPEGs (tests/test_serve_variants.py asserts floors just below):

- text ``int8``: mean cosine 0.937 vs FP32 (min 0.85); ``bf16`` (opt-in,
  off the default ladder): 0.99996.
- text ``trunc64`` (the default lighter rung): the same weights with inputs
  truncated to 64 tokens: mean cosine 0.960 (min 0.50), 78% of the corpus
  unchanged; the long passages that set the p99 cost about a quarter.
- text ``minilm-l3`` (opt-in, off the ladder): mean cosine 0.28 (min 0.03). Dropping layers without
  distillation leaves the output in another space: its vectors cannot be
  compared with FP32 ones (an index built by the primary), and even its own
  similarity ranking agrees poorly (Spearman 0.43 against FP32's). The best
  untrained 3-layer subset, layers (0, 4, 5), reaches only 0.70.
- vision accuracy: ``fp32`` 0.997, ``res32`` 0.994, ``int8`` 0.997.

Dynamic INT8 (``torch.ao.quantization.quantize_dynamic``) has CPU kernels
only: the ``int8`` rungs always run on the CPU, whatever ``device`` the other
rungs use.
"""

from __future__ import annotations

import base64
import binascii
import copy
import io
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab.errors import LatencyLabError, require
from latencylab.serve.types import InferRequest, ProtocolError, Tensor, TensorSpec, Variant

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXTRAS",
    "LADDERS",
    "TextBatch",
    "TextItem",
    "TextVariant",
    "VisionBatch",
    "VisionVariant",
    "build_variants",
    "length_groups",
]

KINDS = ("primary", "lighter", "quantized")

# model -> its ladder, in fallback order: (variant name, kind).
# Text leads with "fp32-onnx": the same FP32 weights on ONNX Runtime, the fastest text runtime measured on a CPU
# (a 208-token passage in 36-39 ms on 2 threads against 55-69 ms for torch eager; docs/serve.md). A GPU server
# puts the torch "fp32" there instead (config.default_ladder): ORT's CPU provider cannot use the device.
LADDERS: dict[str, tuple[tuple[str, str], ...]] = {
    "text": (("fp32-onnx", "primary"), ("trunc64", "lighter"), ("int8", "quantized")),
    "vision": (("fp32", "primary"), ("res32", "lighter"), ("int8", "quantized")),
}
# Variants that can be asked for by name but are not on the default ladder.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "text": (("fp32", "primary"), ("minilm-l3", "lighter"), ("bf16", "lighter"), ("fp32-onnx-unfused", "primary")),
    "vision": (),
}

TEXT_MAX_LENGTH = 256  # tokens; all-MiniLM-L6-v2 was trained at 256
MIN_BUCKET_TOKENS = 16  # the batcher's smallest text cost class (TextVariant.buckets)
LIGHT_TEXT_LAYERS = 3
LIGHT_TEXT_TOKENS = 64
LIGHT_VISION_RES = 32
# The cost of one more encoder call, in padded tokens, when forward splits a batch into
# length groups. Measured for MiniLM-L6 on these 2-vCPU machines at 1 thread: a call
# costs about 11 ms plus 0.35 ms per padded token, so 32 tokens. On a GPU a call's
# fixed cost dwarfs its per-token cost: split only on extreme length spreads.
SPLIT_COST_TOKENS_CPU = 32
SPLIT_COST_TOKENS_CUDA = 4096
# Bigger images are refused before decoding: a 40-byte header can claim a gigapixel.
MAX_IMAGE_PIXELS = 4096 * 4096

# Hugging Face fast tokenizers keep truncation settings in mutable Rust state;
# concurrent calls from the server's worker threads can fail with "Already
# borrowed". Tokenising one request takes well under a millisecond, so one lock
# for every variant costs nothing measurable.
_TOKENIZE_LOCK = threading.Lock()

_WARMUP_TEXT = (
    "A short synthetic sentence, long enough to exercise every layer of the encoder the way a real query would."
)


# ---------------------------------------------------------------- helpers


def _torch() -> Any:
    return require("torch", "torch")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise LatencyLabError(f"variant kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _check_device(device: str) -> str:
    """Normalise "cpu", "cuda" or "cuda:N"; a CUDA device must be visible to torch."""
    dev = device.strip().lower()
    if dev == "cpu":
        return dev
    if dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit()):
        torch = _torch()
        index = int(dev[5:]) if ":" in dev else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise LatencyLabError(f"device {device!r} requested but torch sees no such CUDA device")
        return dev
    raise LatencyLabError(f"device must be cpu, cuda or cuda:N, got {device!r}")


def _check_max_batch_size(max_batch_size: int) -> int:
    if max_batch_size < 1:
        raise LatencyLabError(f"max_batch_size must be >= 1, got {max_batch_size}")
    return int(max_batch_size)


def _bytes_elements(request: InferRequest, name: str, max_rows: int) -> list[Any]:
    """The elements of the 1-D BYTES input ``name``: 1 to ``max_rows`` of them, or a 400."""
    t = request.input(name)
    if t.datatype != "BYTES":
        raise ProtocolError(f"input {name!r} must have datatype BYTES, got {t.datatype}")
    if len(t.shape) != 1:
        raise ProtocolError(f"input {name!r} must be 1-D (shape [-1]), got shape {list(t.shape)}")
    data = np.asarray(t.data, dtype=object).reshape(-1)
    if data.size != t.shape[0]:
        raise ProtocolError(f"input {name!r} declares shape {list(t.shape)} but holds {data.size} element(s)")
    if data.size == 0:
        raise ProtocolError(f"input {name!r} is empty: send at least one element")
    if data.size > max_rows:
        raise ProtocolError(f"input {name!r} has {data.size} elements; this model takes at most {max_rows} per request")
    return list(data)


def _split_counts(counts: Sequence[int], n: int) -> list[tuple[int, int]]:
    if len(counts) != n:
        raise LatencyLabError(f"postprocess: the batch holds {len(counts)} request(s), not {n}")
    spans, start = [], 0
    for k in counts:
        spans.append((start, start + k))
        start += k
    return spans


def _check_warmup_sizes(batch_sizes: Sequence[int], max_batch_size: int) -> list[int]:
    sizes = [int(b) for b in batch_sizes]
    bad = [b for b in sizes if not 1 <= b <= max_batch_size]
    if bad:
        raise LatencyLabError(f"warmup batch sizes must be in [1, {max_batch_size}], got {bad}")
    return sizes


def _quantize_dynamic_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of ``model`` with every nn.Linear replaced by a dynamic INT8 one (per-tensor weights)."""
    torch = _torch()
    with warnings.catch_warnings():
        # torch.ao.quantization announces its deprecation on every call; it still works in 2.13.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model).cpu(), {torch.nn.Linear}, dtype=torch.qint8
        )
    return quantized.eval()


# ---------------------------------------------------------------- text


def length_groups(lengths: Sequence[int], split_cost: int) -> list[list[int]]:
    """Partition rows into groups, each run as one padded encoder call, minimising padded tokens.

    A group costs ``len(group) * max(length in group) + split_cost`` (tokens
    computed, padding included, plus the fixed cost of a call in tokens).
    Sorting rows by length makes the optimal groups contiguous runs of the
    sorted order, so a dynamic programme over prefixes finds them in O(n^2)
    (n is at most a few dozen rows). Ties keep rows together. Returns row
    indices, shortest group first; every row appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda r: lengths[r])
    sorted_lengths = [lengths[r] for r in order]
    n = len(order)
    best = [0] * (n + 1)  # best[j]: least cost of the first j sorted rows
    start = [0] * (n + 1)  # start[j]: where the last group of that solution begins
    for j in range(1, n + 1):
        best[j] = -1
        for i in range(j):
            cost = best[i] + (j - i) * sorted_lengths[j - 1] + split_cost
            if best[j] < 0 or cost < best[j]:
                best[j], start[j] = cost, i
    groups = []
    j = n
    while j > 0:
        groups.append(order[start[j] : j])
        j = start[j]
    return groups[::-1]


@dataclass(frozen=True, slots=True)
class TextItem:
    """One preprocessed text request: the unpadded token ids of each of its texts."""

    ids: tuple[np.ndarray, ...]  # int64, one (length,) array per text, [CLS] ... [SEP]

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(len(a) for a in self.ids)


@dataclass(frozen=True, slots=True)
class TextBatch:
    """What ``TextVariant.forward`` returns: every row's embedding, and how many rows each request owns."""

    embeddings: np.ndarray  # (rows, hidden) float32, L2-normalised
    counts: tuple[int, ...]


class TextVariant:
    """A sentence-embedding variant: BYTES texts -> L2-normalised mean-pooled embeddings.

    ``tokenizer`` and ``model`` are a Hugging Face fast tokenizer and a BERT
    encoder (any module called with ``input_ids`` and ``attention_mask`` that
    returns ``last_hidden_state``). The model is moved to ``device`` and put in
    eval mode. Texts are tokenised unpadded (truncated at ``max_length``
    tokens). ``forward`` sorts the batch's texts by length and splits them into
    groups where padding every text to the longest would waste more tokens
    than another encoder call costs (``split_cost_tokens``; None picks a
    default for the device, a huge value means one call per batch); each group
    is padded to its longest text, and the padding is masked out of attention
    and pooling, so a text's embedding does not depend on what it was batched
    with.
    """

    model_name = "text"

    def __init__(
        self,
        name: str,
        kind: str,
        tokenizer: Any,
        model: Any,
        *,
        max_batch_size: int = 8,
        device: str = "cpu",
        description: str = "",
        max_length: int = TEXT_MAX_LENGTH,
        split_cost_tokens: int | None = None,
    ) -> None:
        _check_kind(kind)
        if max_length < 2:
            raise LatencyLabError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {max_length}")
        self.name = name
        self.kind = kind
        self.max_batch_size = _check_max_batch_size(max_batch_size)
        self.device = _check_device(device)
        self.description = description
        self.max_length = int(max_length)
        self.wide_threads: int | None = None  # intra-op threads for long batches (set by the service config)
        self.wide_tokens = 96
        if split_cost_tokens is None:
            split_cost_tokens = SPLIT_COST_TOKENS_CPU if self.device == "cpu" else SPLIT_COST_TOKENS_CUDA
        if split_cost_tokens < 0:
            raise LatencyLabError(f"split_cost_tokens must be >= 0, got {split_cost_tokens}")
        self.split_cost_tokens = int(split_cost_tokens)
        self.tokenizer = tokenizer
        self.hidden_size = self._bind(model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else 0
        self.inputs: tuple[TensorSpec, ...] = (TensorSpec("TEXT", "BYTES", (-1,)),)
        self.outputs: tuple[TensorSpec, ...] = (TensorSpec("EMBEDDING", "FP32", (-1, self.hidden_size)),)

    def _bind(self, model: Any) -> int:
        """Take ``model`` as this variant's encoder; return the embedding width. (Subclasses bind other runtimes.)"""
        self.module = model.to(self.device).eval()
        return int(model.config.hidden_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, kind={self.kind!r}, device={self.device!r})"

    def preprocess(self, request: InferRequest) -> TextItem:
        """Decode the UTF-8 texts of input ``TEXT`` and tokenise each one, unpadded."""
        texts = []
        for i, el in enumerate(_bytes_elements(request, "TEXT", self.max_batch_size)):
            if isinstance(el, str):
                texts.append(el)
            elif isinstance(el, bytes | bytearray | memoryview):
                try:
                    texts.append(bytes(el).decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise ProtocolError(f"TEXT[{i}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            else:
                raise ProtocolError(f"TEXT[{i}] must be a string, got {type(el).__name__}")
        with _TOKENIZE_LOCK:
            enc = self.tokenizer(
                texts,
                truncation=True,
                max_length=self.max_length,
                return_attention_mask=False,
                return_token_type_ids=False,
            )
        return TextItem(tuple(np.asarray(ids, dtype=np.int64) for ids in enc["input_ids"]))

    def forward(self, items: Sequence[TextItem]) -> TextBatch:
        """Embed every text of every item: one encoder call per length group (see :func:`length_groups`)."""
        rows = [ids for item in items for ids in item.ids]
        counts = tuple(len(item.ids) for item in items)
        emb = np.zeros((len(rows), self.hidden_size), dtype=np.float32)
        for group in length_groups([len(ids) for ids in rows], self.split_cost_tokens):
            emb[group] = self._embed([rows[r] for r in group])
        return TextBatch(emb, counts)

    def _embed(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """(len(rows), hidden) embeddings of token-id rows, padded to the longest and masked."""
        width = max(len(ids) for ids in rows)
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, ids in enumerate(rows):
            input_ids[r, : len(ids)] = ids
            mask[r, : len(ids)] = 1
        return self._encode(input_ids, mask)

    def _encode(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(rows, hidden) L2-normalised mean-pooled embeddings of one padded, masked call."""
        torch = _torch()
        from latencylab.workloads.text import mean_pool_normalize

        width = input_ids.shape[1]
        ids_t = torch.from_numpy(input_ids).to(self.device)
        mask_t = torch.from_numpy(mask).to(self.device)
        before = None
        if self.wide_threads and width >= self.wide_tokens and self.device == "cpu":
            before = torch.get_num_threads()  # per calling thread: only this compute thread changes
            torch.set_num_threads(self.wide_threads)
        try:
            with torch.inference_mode():
                hidden = self.module(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                # Pool in FP32 whatever the model computes in (a BF16 sum over 256 tokens loses digits).
                emb: np.ndarray = mean_pool_normalize(hidden.float(), mask_t).cpu().numpy()
        finally:
            if before is not None:
                torch.set_num_threads(before)
        return emb

    def postprocess(self, raw: TextBatch, n: int) -> list[tuple[Tensor, ...]]:
        """One ``EMBEDDING`` tensor (texts, hidden) per request, in the order of the items."""
        out: list[tuple[Tensor, ...]] = []
        for start, stop in _split_counts(raw.counts, n):
            emb = raw.embeddings[start:stop].copy()
            out.append((Tensor("EMBEDDING", "FP32", emb.shape, emb),))
        return out

    @property
    def buckets(self) -> tuple[int, ...]:
        """The cost classes the batcher queues and times separately: padded widths 16, 32, ... max_length."""
        out, b = [], MIN_BUCKET_TOKENS
        while b < self.max_length:
            out.append(b)
            b *= 2
        return (*out, self.max_length) if self.max_length not in out else tuple(out)

    def bucket(self, item: TextItem) -> int:
        """An item's cost class: the smallest bucket holding all its tokens (beyond max_length for a request
        of several texts: the next power of two). Compute grows with tokens, so a batch of one bucket has
        one predictable cost, and a short text need not wait behind a long one."""
        tokens = sum(item.lengths)
        for b in self.buckets:
            if tokens <= b:
                return b
        return 1 << max(0, tokens - 1).bit_length()

    def warmup_items(self, n: int, bucket: int | None = None) -> list[Any]:
        """``n`` preprocessed items of a synthetic one-sentence request (for warm-up and compute timing); with
        ``bucket``, each one text of three quarters of that many tokens (the middle of the bucket)."""
        if bucket is None:
            request = InferRequest(self.model_name, None, (_bytes_tensor("TEXT", [_WARMUP_TEXT.encode()]),))
            return [self.preprocess(request) for _ in range(n)]
        length = max(2, min(self.max_length, (3 * bucket) // 4))
        with _TOKENIZE_LOCK:
            enc = self.tokenizer([_WARMUP_TEXT * 40], truncation=True, max_length=length, return_attention_mask=False)
        ids = np.asarray(enc["input_ids"][0], dtype=np.int64)
        return [TextItem((ids.copy(),)) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Run every stage twice at each batch size on a synthetic one-sentence request."""
        for bs in _check_warmup_sizes(batch_sizes, self.max_batch_size):
            for _ in range(2):
                self.postprocess(self.forward(self.warmup_items(bs)), bs)


def _load_text_base() -> tuple[Any, Any]:
    from latencylab.workloads.text import load_model

    return load_model(device="cpu")


def _truncate_layers(model: Any, n_layers: int) -> Any:
    """A copy of a BERT encoder keeping only its first ``n_layers`` transformer layers."""
    light = copy.deepcopy(model)
    light.encoder.layer = light.encoder.layer[:n_layers]
    light.config.num_hidden_layers = n_layers
    return light


def _build_text(names: Sequence[str], max_batch_size: int, device: str) -> list[TextVariant]:
    from latencylab.workloads.text import MODEL_NAME

    tok, base = _load_text_base()
    kinds = dict(LADDERS["text"] + EXTRAS["text"])
    models: dict[str, tuple[Any, str, str]] = {}
    # Derive the copies from the CPU base before the primary (which may be the base itself) moves to the device.
    for name in names:
        if name == "trunc64":
            # Same weights, inputs cut at 64 tokens: the long passages that set the p99 cost a quarter.
            models[name] = (
                base,
                device,
                f"{MODEL_NAME} FP32 with inputs truncated to {LIGHT_TEXT_TOKENS} tokens (same weights, same "
                "embedding space; only texts longer than that change)",
            )
        elif name == "minilm-l3":
            models[name] = (
                _truncate_layers(base, LIGHT_TEXT_LAYERS),
                device,
                f"{MODEL_NAME} FP32 truncated to its first {LIGHT_TEXT_LAYERS} of 6 transformer layers "
                "(no retraining: mean cosine vs FP32 only about 0.28, a different embedding space)",
            )
        elif name == "bf16":
            torch = _torch()
            models[name] = (
                copy.deepcopy(base).to(torch.bfloat16),
                device,
                f"{MODEL_NAME} with BF16 weights and activations (pooling in FP32); mean cosine vs FP32 "
                "above 0.9999; fast only where the hardware has BF16 matrix units (AVX-512 BF16, AMX, GPUs)",
            )
        elif name == "int8":
            models[name] = (
                _quantize_dynamic_int8(base),
                "cpu",
                f"{MODEL_NAME} with torch dynamic INT8 Linear layers (weights per-tensor INT8, activations "
                "quantised per batch; embeddings and LayerNorm stay FP32); CPU only; mean cosine vs FP32 about 0.95",
            )
    if "fp32" in names:
        models["fp32"] = (base, device, f"{MODEL_NAME} FP32, 6 layers, mean pooling + L2 normalisation")
    built: dict[str, TextVariant] = {}
    for name in ("fp32-onnx", "fp32-onnx-unfused"):
        if name not in names:
            continue
        from latencylab.serve.ort_text import ort_text_variant

        if device != "cpu":
            raise LatencyLabError(f"variant {name!r} runs on the CPU only (ONNX Runtime's CPU provider)")
        fuse = name == "fp32-onnx"
        built[name] = ort_text_variant(
            name,
            kinds[name],
            tok,
            fuse=fuse,
            max_batch_size=max_batch_size,
            description=f"{MODEL_NAME} FP32 exported to ONNX (pooling and normalisation in the graph)"
            + (", transformer kernels fused by ONNX Runtime's optimizer" if fuse else "")
            + ", ONNX Runtime CPU session: the fp32 rung's embeddings up to float rounding",
        )
    return [
        built[name]
        if name in built
        else TextVariant(
            name,
            kinds[name],
            tok,
            models[name][0],
            max_batch_size=max_batch_size,
            device=models[name][1],
            description=models[name][2],
            max_length=LIGHT_TEXT_TOKENS if name == "trunc64" else TEXT_MAX_LENGTH,
        )
        for name in names
    ]


# ---------------------------------------------------------------- vision


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

        _check_kind(kind)
        if res < 1:
            raise LatencyLabError(f"res must be >= 1, got {res}")
        self.name = name
        self.kind = kind
        self.res = int(res)
        self.max_batch_size = _check_max_batch_size(max_batch_size)
        self.device = _check_device(device)
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
        for i, el in enumerate(_bytes_elements(request, "IMAGE", self.max_batch_size)):
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

        torch = _torch()
        counts = tuple(int(x.shape[0]) for x in items)
        x = items[0] if len(items) == 1 else torch.cat(list(items))
        preds = vision.postprocess(self._forward(x.to(self.device)))
        return VisionBatch(
            np.asarray(preds.probs, dtype=np.float32), np.asarray(preds.class_ids, dtype=np.int64), counts
        )

    def postprocess(self, raw: VisionBatch, n: int) -> list[tuple[Tensor, ...]]:
        """``PROBABILITIES`` (images, classes) and ``CLASS`` (images,) per request, in the order of the items."""
        out: list[tuple[Tensor, ...]] = []
        for start, stop in _split_counts(raw.counts, n):
            probs = raw.probs[start:stop].copy()
            ids = raw.class_ids[start:stop].copy()
            out.append((Tensor("PROBABILITIES", "FP32", probs.shape, probs), Tensor("CLASS", "INT64", ids.shape, ids)))
        return out

    def warmup_items(self, n: int) -> list[Any]:
        """``n`` preprocessed items of a synthetic one-image request (for warm-up and compute timing)."""
        request = InferRequest(self.model_name, None, (_bytes_tensor("IMAGE", [base64.b64encode(_synthetic_jpeg())]),))
        return [self.preprocess(request) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Run every stage twice at each batch size on a synthetic one-image request (base64 JPEG)."""
        for bs in _check_warmup_sizes(batch_sizes, self.max_batch_size):
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


def _build_vision(names: Sequence[str], max_batch_size: int, device: str) -> list[VisionVariant]:
    from latencylab.workloads import WorkloadOptions, digits_cnn, vision

    kinds = dict(LADDERS["vision"])
    default_res = vision.VisionSpec().res
    base = None
    if "fp32" in names or "int8" in names:
        base = vision.load_model(WorkloadOptions())
    specs: dict[str, tuple[Any, int, str, str]] = {}
    for name in names:
        if name == "res32":
            light = vision.load_model(WorkloadOptions(params={"res": str(LIGHT_VISION_RES)}))
            specs[name] = (
                light.model,
                LIGHT_VISION_RES,
                device,
                f"{digits_cnn.MODEL_NAME} FP32 trained and served at {LIGHT_VISION_RES}x{LIGHT_VISION_RES} input; "
                f"held-out accuracy {light.test_accuracy:.3f}",
            )
        elif name == "int8":
            assert base is not None
            specs[name] = (
                _quantize_dynamic_int8(base.model),
                default_res,
                "cpu",
                f"{digits_cnn.MODEL_NAME} at {default_res}x{default_res} with a dynamic INT8 classifier "
                "(nn.Linear); the conv layers stay FP32, so most of the compute is unchanged; CPU only",
            )
    if "fp32" in names:
        assert base is not None
        specs["fp32"] = (
            base.model,
            default_res,
            device,
            f"{digits_cnn.MODEL_NAME} FP32 at {default_res}x{default_res} input; "
            f"held-out accuracy {base.test_accuracy:.3f}",
        )
    return [
        VisionVariant(
            name,
            kinds[name],
            specs[name][0],
            specs[name][1],
            max_batch_size=max_batch_size,
            device=specs[name][2],
            description=specs[name][3],
        )
        for name in names
    ]


# ---------------------------------------------------------------- registry

_BUILDERS: dict[str, Callable[[Sequence[str], int, str], Sequence[Variant]]] = {
    "text": _build_text,
    "vision": _build_vision,
}


def build_variants(
    model: str,
    names: Sequence[str] | None = None,
    max_batch_size: int = 8,
    device: str = "cpu",
) -> list[Variant]:
    """The variants ``names`` of built-in ``model`` ("text" or "vision"), in the order given.

    ``names`` defaults to the whole ladder: primary, lighter, quantized
    (:data:`LADDERS`); :data:`EXTRAS` lists variants that exist off the
    default ladder (text ``fp32``, torch eager, and ``bf16``). Weights
    are loaded once per call and shared: the torch rungs serve the loaded model
    or copies of it (except vision ``res32``, a separately trained model from
    the same weights cache); text ``fp32-onnx`` is its cached ONNX export.
    """
    if model not in LADDERS:
        raise LatencyLabError(f"unknown model {model!r}; known models: {', '.join(LADDERS)}")
    ladder = [name for name, _ in LADDERS[model]]
    known = ladder + [name for name, _ in EXTRAS[model]]
    chosen = list(ladder if names is None else names)
    if not chosen:
        raise LatencyLabError(f"no variants requested for model {model!r}; known variants: {', '.join(known)}")
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise LatencyLabError(
            f"unknown variant(s) {', '.join(map(repr, unknown))} of model {model!r}; known variants: {', '.join(known)}"
        )
    if len(set(chosen)) != len(chosen):
        raise LatencyLabError(f"variant names repeat: {chosen}")
    _check_max_batch_size(max_batch_size)
    dev = _check_device(device)
    return list(_BUILDERS[model](chosen, max_batch_size, dev))


def _bytes_tensor(name: str, values: Sequence[bytes]) -> Tensor:
    data = np.empty(len(values), dtype=object)
    data[:] = list(values)
    return Tensor(name, "BYTES", (len(values),), data)
