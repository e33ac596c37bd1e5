"""The built-in text variant: BYTES texts -> all-MiniLM-L6-v2 sentence embeddings, batched by length.

Tokenisation is the text workload's own tokenizer, so what the server computes for a request is what the
``text`` workload computes for the same input. :class:`TextVariant` runs the encoder in torch; the ONNX Runtime
rungs (serve/ort_text.py) reuse everything but the encoder call. Which rungs exist, and how they are built:
serve/variants.py.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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

__all__ = ["TEXT_MAX_LENGTH", "TextBatch", "TextItem", "TextVariant", "length_groups"]

TEXT_MAX_LENGTH = 256  # tokens; all-MiniLM-L6-v2 was trained at 256
MIN_BUCKET_TOKENS = 16  # the batcher's smallest text cost class (TextVariant.buckets)
# The cost of one more encoder call, in padded tokens, when forward splits a batch into
# length groups. Measured for MiniLM-L6 on these 2-vCPU machines at 1 thread: a call
# costs about 11 ms plus 0.35 ms per padded token, so 32 tokens. On a GPU a call's
# fixed cost dwarfs its per-token cost: split only on extreme length spreads.
SPLIT_COST_TOKENS_CPU = 32
SPLIT_COST_TOKENS_CUDA = 4096

# Hugging Face fast tokenizers keep truncation settings in mutable Rust state;
# concurrent calls from the server's worker threads can fail with "Already
# borrowed". Tokenising one request takes well under a millisecond, so one lock
# for every variant costs nothing measurable.
_TOKENIZE_LOCK = threading.Lock()

_WARMUP_TEXT = (
    "A short synthetic sentence, long enough to exercise every layer of the encoder the way a real query would."
)


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
        check_kind(kind)
        if max_length < 2:
            raise LatencyLabError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {max_length}")
        self.name = name
        self.kind = kind
        self.max_batch_size = check_max_batch_size(max_batch_size)
        self.device = check_device(device)
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
        for i, el in enumerate(bytes_elements(request, "TEXT", self.max_batch_size)):
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
        torch = torch_module()
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
        for start, stop in split_counts(raw.counts, n):
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
            request = InferRequest(self.model_name, None, (bytes_tensor("TEXT", [_WARMUP_TEXT.encode()]),))
            return [self.preprocess(request) for _ in range(n)]
        length = max(2, min(self.max_length, (3 * bucket) // 4))
        with _TOKENIZE_LOCK:
            enc = self.tokenizer([_WARMUP_TEXT * 40], truncation=True, max_length=length, return_attention_mask=False)
        ids = np.asarray(enc["input_ids"][0], dtype=np.int64)
        return [TextItem((ids.copy(),)) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Run every stage twice at each batch size on a synthetic one-sentence request."""
        for bs in check_warmup_sizes(batch_sizes, self.max_batch_size):
            for _ in range(2):
                self.postprocess(self.forward(self.warmup_items(bs)), bs)
