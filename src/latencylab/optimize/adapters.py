"""Model adapters for the built-in workloads (text: MiniLM embeddings; vision: digits CNN logits)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.types import Feed


class TextAdapter:
    """all-MiniLM-L6-v2 with mean pooling + L2 normalisation inside the model (output: (B, 384) embeddings).

    Two held-out input sets (:meth:`input_sets`), both reported, and a variant is inside the budget only if
    it is inside on both:

    * ``sentences``: the corpus's held-out lines tokenised as the user's pipeline declares (``padding``):
      ``"longest"`` (the default, the tokenizer's and the text workload's own: pad to the longest in the
      batch, so a single sentence is not padded at all) or ``"max_length"`` (every input padded to
      ``seq_len``: a declared pipeline whose padding a shape policy may then trim, reported as a pipeline
      gain);
    * ``passages{seq_len}``: passages of exactly ``seq_len`` real tokens (consecutive held-out lines joined,
      then truncated), no padding at all: the "batch 1, sequence 128" of a long input.

    Held-out: corpus lines whose index is not a multiple of 5; calibration: the multiples of 5, padded to
    ``seq_len`` (one shape: ONNX Runtime's histogram calibrators stack activations across inputs).
    """

    name = "text"
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    output_kind = "embedding"
    PADDINGS = ("longest", "max_length")

    def __init__(
        self,
        seq_len: int | None = 128,
        batch_size: int = 1,
        n_heldout: int = 64,
        n_calib: int = 32,
        padding: str = "longest",
        n_passages: int = 16,
    ) -> None:
        if padding not in self.PADDINGS:
            raise LatencyLabError(f"text: padding {padding!r} is not one of {', '.join(self.PADDINGS)}")
        if padding == "max_length" and not seq_len:
            raise LatencyLabError("text: padding=max_length needs a --seq-len")
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.n_heldout = n_heldout
        self.n_calib = n_calib
        self.padding = padding
        self.n_passages = n_passages if seq_len else 0

    @cached_property
    def _loaded(self) -> tuple[Any, Any]:
        from latencylab.workloads.text import load_model

        # eager attention: ONNX Runtime's transformer optimizer fuses attention only from this export
        return load_model(attn="eager")

    def torch_model(self) -> Any:
        from latencylab.workloads.text import embedding_module

        return embedding_module(self._loaded[1])

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        import torch

        from latencylab.workloads.text import export_embedding_onnx

        model = self.torch_model()
        feed = self.heldout()[0]
        args = tuple(torch.from_numpy(feed[n]) for n in self.input_names)
        path.parent.mkdir(parents=True, exist_ok=True)
        export_embedding_onnx(model, args, str(path), opset)
        return path

    def _feeds(self, texts: list[str], padding: str | None = None) -> list[Feed]:
        tok, _ = self._loaded
        out = []
        for i in range(0, len(texts) - self.batch_size + 1, self.batch_size):
            chunk = texts[i : i + self.batch_size]
            if (padding or self.padding) == "longest" or not self.seq_len:
                enc = tok(chunk, padding="longest", truncation=True, max_length=256, return_tensors="np")
            else:
                enc = tok(chunk, padding="max_length", truncation=True, max_length=self.seq_len, return_tensors="np")
            out.append({n: np.ascontiguousarray(enc[n].astype(np.int64)) for n in self.input_names})
        return out

    @cached_property
    def _passages(self) -> list[Feed]:
        from latencylab.workloads.text import passages

        if not self.seq_len or not self.n_passages:
            return []
        tok, _ = self._loaded
        texts = passages(tok, self._splits[0], self.seq_len, self.n_passages * self.batch_size)
        out = []
        for i in range(0, len(texts) - self.batch_size + 1, self.batch_size):
            enc = tok(texts[i : i + self.batch_size], padding="max_length", truncation=True,
                      max_length=self.seq_len, return_tensors="np")  # fmt: skip
            feed = {n: np.ascontiguousarray(enc[n].astype(np.int64)) for n in self.input_names}
            if not feed["attention_mask"].all():
                raise LatencyLabError(f"text: a passage is shorter than {self.seq_len} tokens")
            out.append(feed)
        return out

    def input_sets(self) -> dict[str, list[Feed]]:
        sets = {"sentences": self.heldout()}
        if self._passages:
            sets[f"passages{self.seq_len}"] = self._passages
        return sets

    @cached_property
    def _splits(self) -> tuple[list[str], list[str]]:
        from latencylab.workloads.text import corpus

        texts = list(corpus())
        held = [t for i, t in enumerate(texts) if i % 5 != 0]
        calib = [t for i, t in enumerate(texts) if i % 5 == 0]
        return held, calib

    def heldout(self) -> list[Feed]:
        return self._feeds(self._splits[0][: self.n_heldout * self.batch_size])

    def calibration(self) -> list[Feed]:
        # one shape for every calibration input: ONNX Runtime's histogram calibrators (entropy, percentile)
        # stack activations across inputs; padded positions are masked out of the output like at run time
        return self._feeds(self._splits[1][: self.n_calib * self.batch_size], padding="max_length")

    def labels(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        sets = self.input_sets()
        return {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            "seq_len": self.seq_len,
            "padding": self.padding,
            "batch_size": self.batch_size,
            "heldout_feeds": self.n_heldout,
            "calibration_feeds": self.n_calib,
            "input_sets": {
                name: {
                    "feeds": len(feeds),
                    "mean_tokens": float(np.mean([f["attention_mask"].sum(axis=1).mean() for f in feeds])),
                    "mean_positions": float(np.mean([f["attention_mask"].shape[1] for f in feeds])),
                }
                for name, feeds in sets.items()
            },
        }


class VisionAdapter:
    """The digits CNN on preprocessed held-out JPEGs (output: (B, 10) logits; task metric: accuracy)."""

    name = "vision"
    input_names: tuple[str, ...] = ("pixels",)
    output_kind = "logits"

    def __init__(self, batch_size: int = 1, res: int = 64) -> None:
        self.batch_size = batch_size
        self.res = res

    @cached_property
    def _model(self) -> Any:
        from latencylab.workloads import WorkloadOptions
        from latencylab.workloads.vision import load_model

        return load_model(WorkloadOptions(params={"res": str(self.res)})).model

    def torch_model(self) -> Any:
        return self._model.eval()

    @cached_property
    def _data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from latencylab.workloads.vision import Preprocess, decode, digits_jpeg_splits

        train, test = digits_jpeg_splits()
        x_test = Preprocess(self.res)(decode(test.jpegs)).numpy()
        x_cal = Preprocess(self.res)(decode(train.jpegs[:64])).numpy()
        return x_test, np.asarray(test.labels, dtype=np.int64), x_cal

    def _batches(self, x: np.ndarray) -> list[Feed]:
        b = self.batch_size
        return [{"pixels": np.ascontiguousarray(x[i : i + b])} for i in range(0, len(x) - b + 1, b)]

    def heldout(self) -> list[Feed]:
        return self._batches(self._data[0])

    def calibration(self) -> list[Feed]:
        return self._batches(self._data[2])

    def labels(self) -> np.ndarray | None:
        n = len(self.heldout()) * self.batch_size
        return self._data[1][:n]

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        import torch

        x = torch.from_numpy(self.heldout()[0]["pixels"])
        path.parent.mkdir(parents=True, exist_ok=True)
        model = self.torch_model()  # outside inference_mode: with an empty cache this trains the model
        with torch.inference_mode():
            torch.onnx.export(
                model, (x,), str(path), input_names=["pixels"], output_names=["logits"],
                dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}}, opset_version=opset, dynamo=False,
            )  # fmt: skip
        return path

    def describe(self) -> dict[str, Any]:
        return {"model": "digits CNN", "res": self.res, "batch_size": self.batch_size, "heldout_images": 360}


class OnnxFileAdapter:
    """A user's ONNX file: ONNX Runtime families only (there is no torch module to transform).

    Inputs come from ``--inputs`` (an .npz, as ``latencylab profile --model``) or are generated from the
    declared input shapes (``dim.<name>=N`` params fix symbolic dims). Feeds are split by index: every fifth
    one is for calibration, the others are held out for fidelity and latency. Fidelity is cosine against
    the FP32 session's first output (``output_kind = "embedding"``); state another budget (e.g. ``top1>=0.99``)
    for classifiers.
    """

    name = "onnx"
    output_kind = "embedding"
    has_torch = False

    def __init__(
        self,
        model_path: str,
        inputs_path: str | None = None,
        batch_size: int = 1,
        params: dict[str, str] | None = None,
        n_feeds: int = 40,
    ) -> None:
        from latencylab.workloads import WorkloadOptions
        from latencylab.workloads.onnx_model import build

        self.model_path = str(Path(model_path).resolve())
        self.inputs_path = inputs_path
        self.batch_size = batch_size
        pipe = build(WorkloadOptions(batch_size=batch_size, model_path=model_path, inputs_path=inputs_path,
                                     params=dict(params or {})))  # fmt: skip
        self._meta = dict(pipe.metadata)
        self.input_names = tuple(str(i["name"]) for i in self._meta["inputs"])
        pool = int(self._meta.get("pool_size") or 1)
        feeds = [dict(pipe.source(i)) for i in range(max(pool, 1))]
        while len(feeds) < n_feeds and pool > 1:
            feeds += feeds[: n_feeds - len(feeds)]
        held = [f for i, f in enumerate(feeds) if i % 5 != 0]
        calib = [f for i, f in enumerate(feeds) if i % 5 == 0]
        self._held = held or feeds
        self._calib = calib or feeds

    def torch_model(self) -> Any:
        raise LatencyLabError("an ONNX file has no torch module: only the onnxruntime family applies")

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        import shutil

        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.model_path, path)
        return path

    def heldout(self) -> list[Feed]:
        return self._held

    def calibration(self) -> list[Feed]:
        return self._calib

    def labels(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "model": Path(self.model_path).name,
            "model_path": self.model_path,
            "model_sha256": self._meta.get("model_sha256"),
            "inputs_path": self.inputs_path,
            "input_origin": self._meta.get("input_origin"),
            "batch_size": self.batch_size,
            "heldout_feeds": len(self._held),
            "calibration_feeds": len(self._calib),
        }


def load_adapter_factory(spec: str, **kwargs: Any) -> Any:
    """``package.module:function`` -> the ModelAdapter it returns (called with batch_size=..., seq_len=...)."""
    import importlib

    mod_name, sep, fn_name = spec.partition(":")
    if not sep or not mod_name or not fn_name:
        raise LatencyLabError(f"--pipeline {spec!r} must look like package.module:function")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise LatencyLabError(f"--pipeline {spec}: cannot import it ({type(exc).__name__}: {exc})") from None
    adapter = fn(**kwargs)
    needed = ("name", "input_names", "output_kind", "torch_model", "export_onnx", "heldout", "calibration", "labels")
    missing = [m for m in (*needed, "describe") if not hasattr(adapter, m)]
    if missing:
        raise LatencyLabError(f"--pipeline {spec}: the object it returns is not a ModelAdapter (missing {missing})")
    return adapter


def adapter_for(workload: str, **kwargs: Any) -> Any:
    if workload == "text":
        params = dict(kwargs.get("params") or {})
        unknown = set(params) - {"padding"}
        if unknown:
            raise LatencyLabError(f"optimize --workload text: unknown --param {sorted(unknown)} (known: padding)")
        return TextAdapter(
            **{k: v for k, v in kwargs.items() if k in ("seq_len", "batch_size")},
            padding=params.get("padding", "longest"),
        )
    if workload == "vision":
        return VisionAdapter(**{k: v for k, v in kwargs.items() if k in ("batch_size", "res")})
    if workload == "onnx":
        if not kwargs.get("model_path"):
            raise LatencyLabError("optimize: workload onnx needs --model FILE.onnx")
        return OnnxFileAdapter(
            kwargs["model_path"], kwargs.get("inputs_path"), kwargs.get("batch_size", 1), kwargs.get("params")
        )
    if workload == "pipeline":
        if not kwargs.get("pipeline"):
            raise LatencyLabError("optimize: workload pipeline needs --pipeline package.module:function")
        return load_adapter_factory(
            kwargs["pipeline"], batch_size=kwargs.get("batch_size", 1), seq_len=kwargs.get("seq_len")
        )
    raise LatencyLabError(f"optimize: unknown workload {workload!r}; built-in: text, vision (or --model, --pipeline)")
