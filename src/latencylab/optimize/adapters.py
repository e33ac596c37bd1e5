"""Model adapters: the built-in workloads (text: MiniLM embeddings; vision: digits CNN logits), a user's ONNX file
or Hugging Face directory (``--model``), and ``--pipeline`` factories."""

from __future__ import annotations

import hashlib
import math
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

    def shape_feed(self) -> Feed:
        """One batch of the model's input shape, all zeros: a CNN's FLOPs and traffic depend on the shape
        alone, so the roofline counts them on this without decoding the held-out JPEGs (~3 s)."""
        return {"pixels": np.zeros((self.batch_size, 3, self.res, self.res), dtype=np.float32)}

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


MIN_HELDOUT = 10  # held-out samples needed to judge a budget: fewer, and one row moves top-1 by over 10%
CALIBRATION_EVERY = 5  # sample i calibrates when i % 5 == 0; the others are held out
N_GENERATED = 40  # generated feeds (no --inputs): 32 held out, 8 for calibration


def min_samples(min_heldout: int = MIN_HELDOUT, every: int = CALIBRATION_EVERY) -> int:
    """The fewest samples whose split leaves ``min_heldout`` held out (13 for 10 held out, every fifth calibrating)."""
    n = min_heldout
    while n - math.ceil(n / every) < min_heldout:
        n += 1
    return n


def split_samples(n: int, every: int = CALIBRATION_EVERY) -> tuple[np.ndarray, np.ndarray]:
    """(held-out, calibration) sample indices of ``n`` samples: disjoint, together all of them."""
    idx = np.arange(n)
    return idx[idx % every != 0], idx[idx % every == 0]


def model_digest(path: str | Path) -> str:
    """sha256 of a model file, or of a Hugging Face directory's config and weights."""
    from latencylab.optimize.hf_export import directory_digest

    p = Path(path)
    if p.is_dir():
        return directory_digest(p)
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class OnnxFileAdapter:
    """A user's ONNX file, or a Hugging Face model directory exported to one (:mod:`.hf_export`): ONNX
    Runtime families only (there is no torch module to transform).

    Inputs come from ``--inputs`` (an .npz, as ``latencylab profile --model``) or are generated by the onnx
    workload's guessing rules (:func:`latencylab.workloads.onnx_model.guess_rule`), the symbolic dims at
    ``seq_len`` unless ``dim.<name>=N`` params fix them. The .npz's samples are split by index into
    disjoint sets: every fifth sample (0, 5, 10, ...) calibrates, all the others are held out for fidelity
    and latency, in batches of ``batch_size``; fewer than :data:`MIN_HELDOUT` held-out samples are refused.
    Fidelity is cosine against the FP32 session's first output (``output_kind = "embedding"``; a Hugging
    Face classifier's logits are ``"logits"``); state another budget (e.g. ``top1>=0.99``) for classifiers.
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
        seq_len: int | None = None,
        workdir: Path | None = None,
    ) -> None:
        from latencylab.optimize.hf_export import check_directory, export_directory, onnx_in_directory
        from latencylab.workloads import WorkloadOptions
        from latencylab.workloads.onnx_model import open_model

        src = Path(model_path).expanduser()
        self.source_path = str(src.resolve())
        self.inputs_path = str(Path(inputs_path).expanduser().resolve()) if inputs_path else None
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.params = dict(params or {})
        self.exported: dict[str, Any] | None = None
        onnx_path = src
        if src.is_dir():
            check_directory(src)
            inside = onnx_in_directory(src)
            if inside is not None:
                onnx_path = inside
            else:
                if workdir is None:
                    raise LatencyLabError(f"--model {model_path}: exporting a model directory needs a work directory")
                onnx_path = Path(workdir) / "hf-export" / "model.onnx"
                self.exported = export_directory(src, onnx_path)
                self.output_kind = str(self.exported["output_kind"])
        self.model_path = str(onnx_path.resolve()) if onnx_path.exists() else str(onnx_path)
        wl_params = dict(self.params)
        if seq_len and "dim" not in wl_params:
            wl_params["dim"] = str(seq_len)  # the guess for symbolic dims: --seq-len
        model = open_model(WorkloadOptions(batch_size=batch_size, model_path=str(onnx_path), inputs_path=inputs_path,
                                           params=wl_params))  # fmt: skip
        self._meta = dict(model.metadata)
        self.input_names = tuple(str(i["name"]) for i in self._meta["inputs"])
        if model.npz is not None:
            held_idx, calib_idx = split_samples(model.npz.samples)
            if len(held_idx) < MIN_HELDOUT:
                raise LatencyLabError(
                    f"{model.npz.label} holds {model.npz.samples} sample(s): optimize calibrates on every "
                    f"{_ordinal(CALIBRATION_EVERY)} and judges the budget on the others, which needs at least "
                    f"{MIN_HELDOUT} held out, i.e. at least {min_samples()} samples ({len(held_idx)} held out now)"
                )
            self._held, self._calib = model.npz.feeds(held_idx), model.npz.feeds(calib_idx)
            self._samples = (len(held_idx), len(calib_idx))
        else:
            feeds = model.generated(N_GENERATED)
            self._held = [f for i, f in enumerate(feeds) if i % CALIBRATION_EVERY != 0]
            self._calib = [f for i, f in enumerate(feeds) if i % CALIBRATION_EVERY == 0]
            self._samples = (len(self._held) * batch_size, len(self._calib) * batch_size)
        self._digest = model_digest(src) if src.is_dir() else self._meta.get("model_sha256")

    def torch_model(self) -> Any:
        raise LatencyLabError("an ONNX file has no torch module: only the onnxruntime family applies")

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        """The user's file, copied; a graph with unnamed nodes is saved with names given to them
        (``<op>_<index>``, unique), since the quantiser keeps nodes in float by name (the fallback recipes)."""
        import shutil

        import onnx

        path.parent.mkdir(parents=True, exist_ok=True)
        head = onnx.load(str(self.model_path), load_external_data=False)
        if all(n.name for n in head.graph.node):
            shutil.copyfile(self.model_path, path)
            return path
        model = onnx.load(str(self.model_path))
        taken = {n.name for n in model.graph.node if n.name}
        for i, n in enumerate(model.graph.node):
            if not n.name:
                name = f"{n.op_type}_{i}"
                while name in taken:
                    name += "_"
                n.name = name
                taken.add(name)
        onnx.save(model, str(path))
        return path

    def heldout(self) -> list[Feed]:
        return self._held

    def calibration(self) -> list[Feed]:
        return self._calib

    def labels(self) -> np.ndarray | None:
        return None

    def inputs_line(self) -> str:
        """One line: where the inputs come from and how they were split (printed by the frontend)."""
        held, calib = self._samples
        split = (
            f"{held} held out (fidelity and latency, {len(self._held)} feeds of batch {self.batch_size}), "
            f"{calib} for calibration (disjoint)"
        )
        if self._meta.get("input_origin") == "npz":
            return f"inputs: {Path(self.inputs_path or '').name}, {held + calib} samples: {split}"
        return f"inputs: guessed (no --inputs), {held + calib} samples: {split}"

    def describe(self) -> dict[str, Any]:
        held, calib = self._samples
        return {
            "model": Path(self.source_path).name,
            "model_path": self.source_path,
            "model_sha256": self._digest,
            "exported": self.exported,
            "inputs_path": self.inputs_path,
            "inputs_sha256": self._meta.get("inputs_sha256"),
            "input_origin": self._meta.get("input_origin"),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "params": dict(self.params),
            "output_kind": self.output_kind,
            "samples": held + calib,
            "heldout_samples": held,
            "calibration_samples": calib,
            "heldout_feeds": len(self._held),
            "calibration_feeds": len(self._calib),
            "inputs_line": self.inputs_line(),
            "guessed_inputs": self._meta.get("guessed") or [],
            "guessed_dims": self._meta.get("guessed_dims") or {},
        }


def _ordinal(n: int) -> str:
    return {2: "second", 3: "third", 4: "fourth", 5: "fifth"}.get(n, f"{n}th")


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
        if kwargs.get("params"):
            raise LatencyLabError(f"optimize --workload vision takes no --param (got {sorted(kwargs['params'])})")
        return VisionAdapter(**{k: v for k, v in kwargs.items() if k in ("batch_size", "res")})
    if workload == "onnx":
        if not kwargs.get("model_path"):
            raise LatencyLabError("optimize: workload onnx needs --model FILE.onnx (or a Hugging Face model directory)")
        return OnnxFileAdapter(
            kwargs["model_path"],
            kwargs.get("inputs_path"),
            kwargs.get("batch_size", 1),
            kwargs.get("params"),
            seq_len=kwargs.get("seq_len"),
            workdir=kwargs.get("workdir"),
        )
    if workload == "pipeline":
        if not kwargs.get("pipeline"):
            raise LatencyLabError("optimize: workload pipeline needs --pipeline package.module:function")
        return load_adapter_factory(
            kwargs["pipeline"], batch_size=kwargs.get("batch_size", 1), seq_len=kwargs.get("seq_len")
        )
    raise LatencyLabError(f"optimize: unknown workload {workload!r}; built-in: text, vision (or --model, --pipeline)")
