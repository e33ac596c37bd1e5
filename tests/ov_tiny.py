"""A tiny transformer encoder with the text interface, as an optimize adapter (shared by the OpenVINO and TVM
family tests): input_ids + attention_mask (int64) -> an L2-normalised mean-pooled embedding, exported in seconds."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

Feed = dict[str, np.ndarray]
VOCAB = 64
WIDTH = 32


class TinyEncoder(torch.nn.Module):
    """Embedding, one self-attention block and one feed-forward block with layer norms, masked mean pooling:
    the structure :func:`detect_encoder` calls a transformer (Softmax, two LayerNorms, four or more MatMuls)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.ln1, self.ln2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.ff1, self.ff2 = torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        m = attention_mask.to(x.dtype)
        scores = self.q(x) @ self.k(x).transpose(1, 2) / WIDTH**0.5 + (1.0 - m[:, None, :]) * -1e4
        x = self.ln1(x + self.o(torch.softmax(scores, dim=-1) @ self.v(x)))
        x = self.ln2(x + self.ff2(torch.relu(self.ff1(x))))
        pooled = (x * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1)


def _feed(rng: np.random.Generator, length: int, pad_to: int | None = None) -> Feed:
    width = pad_to or length
    ids = np.zeros((1, width), np.int64)
    mask = np.zeros((1, width), np.int64)
    ids[0, :length] = rng.integers(1, VOCAB, length)
    mask[0, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


class TinyMlp(torch.nn.Module):
    """Not a transformer: embedding, one hidden layer, masked mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.ff = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.to(torch.float32)
        x = torch.relu(self.ff(self.emb(input_ids)))
        return (x * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1.0)


class TinyTextAdapter:
    """``lengths``: the held-out sentences' lengths (batch 1, unpadded); a second set of fixed 16-token inputs.
    ``encoder=False``: a model that is not a transformer (:class:`TinyMlp`)."""

    name = "tiny-text"
    input_names = ("input_ids", "attention_mask")
    output_kind = "embedding"
    has_torch = True

    def __init__(self, lengths: tuple[int, ...] = (5, 9, 12, 5, 9, 12), encoder: bool = True) -> None:
        torch.manual_seed(0)
        self.model = (TinyEncoder() if encoder else TinyMlp()).eval()
        rng = np.random.default_rng(0)
        self._sets = {
            "sentences": [_feed(rng, n) for n in lengths],
            "passages16": [_feed(rng, 16) for _ in range(2)],
        }
        self._calib = [_feed(rng, int(n), 16) for n in rng.integers(4, 16, 16)]

    def torch_model(self) -> Any:
        return self.model

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        f = self._sets["sentences"][0]
        args = (torch.from_numpy(f["input_ids"]), torch.from_numpy(f["attention_mask"]))
        axes = {
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "embedding": {0: "batch"},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice: it is the one wanted here
            warnings.simplefilter("ignore", DeprecationWarning)
            kw = {"input_names": list(self.input_names), "output_names": ["embedding"], "dynamic_axes": axes}
            torch.onnx.export(self.model, args, str(path), opset_version=opset, dynamo=False, **kw)
        return path

    def input_sets(self) -> dict[str, list[Feed]]:
        return dict(self._sets)

    def heldout(self) -> list[Feed]:
        return list(self._sets["sentences"])

    def calibration(self) -> list[Feed]:
        return list(self._calib)

    def labels(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"model": "tiny-encoder", "width": WIDTH}

    def reference(self, feeds: list[Feed]) -> np.ndarray:
        """The FP32 torch outputs of ``feeds``."""
        with torch.inference_mode():
            outs = [self.model(*(torch.from_numpy(f[n]) for n in self.input_names)).numpy() for f in feeds]
        return np.concatenate(outs).astype(np.float32)


def text_interface_onnx(path: Path, scale: float, width: int = 4) -> Path:
    """A real ONNX graph with the serving text interface, any token ids: embedding = mean(ids * mask) * scale *
    (1, 2, ..., width)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("Cast", ["masked"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Mul", ["m", "w"], ["embedding"]),
    ]
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, width], [scale * (i + 1) for i in range(width)])
    graph = helper.make_graph(
        nodes,
        "tiny-text",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class TinyCnn(torch.nn.Module):
    """Two 3x3 convolutions with ReLU, global average pooling, a linear head: (B, 3, 16, 16) -> (B, 10) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c2(torch.relu(self.c1(pixels))))
        return self.head(x.mean((2, 3)))


class TinyVisionAdapter:
    """The vision interface on :class:`TinyCnn`: ``pixels`` (1, 3, 16, 16) -> ``logits``; ``n`` held-out images
    whose labels are the FP32 model's top-1 except every fifth (so FP32's accuracy is 0.8, not 1), 16 for
    calibration."""

    name = "tiny-vision"
    input_names = ("pixels",)
    output_kind = "logits"
    has_torch = True

    def __init__(self, n: int = 40) -> None:
        torch.manual_seed(0)
        self.model = TinyCnn().eval()
        rng = np.random.default_rng(1)
        self._held = [{"pixels": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]
        self._calib = [{"pixels": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
        top1 = self.reference(self._held).argmax(1)
        self._labels = np.where(np.arange(n) % 5 == 4, (top1 + 1) % 10, top1).astype(np.int64)

    def torch_model(self) -> Any:
        return self.model

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(self.model, (torch.from_numpy(self._held[0]["pixels"]),), str(path), opset_version=opset,
                              input_names=["pixels"], output_names=["logits"],
                              dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)  # fmt: skip
        return path

    def heldout(self) -> list[Feed]:
        return list(self._held)

    def calibration(self) -> list[Feed]:
        return list(self._calib)

    def labels(self) -> np.ndarray | None:
        return self._labels

    def describe(self) -> dict[str, Any]:
        return {"model": "tiny-cnn", "res": 16}

    def reference(self, feeds: list[Feed]) -> np.ndarray:
        with torch.inference_mode():
            return np.concatenate([self.model(torch.from_numpy(f["pixels"])).numpy() for f in feeds]).astype(np.float32)
