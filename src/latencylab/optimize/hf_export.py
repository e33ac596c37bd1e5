"""A Hugging Face model directory (``save_pretrained``) as ``optimize --model DIR``: exported to ONNX first.

The export is the text workload's (:func:`latencylab.workloads.text.export_embedding_onnx`): inputs
``input_ids`` and ``attention_mask`` with dynamic batch and sequence axes, opset 17, eager attention (ONNX
Runtime's transformer optimizer fuses attention only from that export). What the model returns:

* a sequence classifier (``config.architectures`` names ``...ForSequenceClassification``): its ``logits``
  (``AutoModelForSequenceClassification``), compared by top-1 agreement;
* any other encoder: ``AutoModel``'s last hidden state mean-pooled over the attention mask and
  L2-normalised (``embedding``), compared by cosine, as sentence-transformers pools MiniLM.

Decoders and encoder-decoders are refused with the command that exports them. Everything is read from the
directory only (``local_files_only``): nothing is downloaded. A directory that already holds ``model.onnx``
(an ``optimum-cli export onnx`` output) is used as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.onnx.data")
_DECODERS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForSeq2SeqLM")
EXPORT_SEQ = 8  # the traced example's length (the axis is dynamic)


def is_hf_directory(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def onnx_in_directory(path: str | Path) -> Path | None:
    """``DIR/model.onnx`` when the directory is an ONNX export already (e.g. optimum's)."""
    p = Path(path) / "model.onnx"
    return p if p.is_file() else None


def check_directory(path: str | Path) -> None:
    """Raise the one-line advice when ``path`` is a directory latencylab cannot take as a model."""
    p = Path(path)
    if not p.is_dir() or is_hf_directory(p) or onnx_in_directory(p):
        return
    raise LatencyLabError(
        f"--model {path} is a directory without config.json or model.onnx: give an .onnx file, or a Hugging Face "
        "model directory (the output of save_pretrained)"
    )


def directory_digest(path: str | Path) -> str:
    """sha256 over the directory's config.json and weight (or ONNX) files, names and bytes, sorted: what identifies
    the model the export is made from (a recipe refuses to rebuild from another one)."""
    root = Path(path)
    files = sorted({root / "config.json", *(f for pat in WEIGHT_FILES for f in root.glob(pat))})
    h = hashlib.sha256()
    for f in files:
        if not f.is_file():
            continue
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError("transformers", "text") from exc
    with contextlib.suppress(Exception):  # the loader's progress bars are noise in optimize's output
        transformers.utils.logging.disable_progress_bar()
    return transformers


def _load(cls: Any, path: Path) -> Any:
    try:
        return cls.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    except (TypeError, ValueError):  # a model class without the attention switch
        return cls.from_pretrained(path, local_files_only=True)


def export_directory(src: str | Path, dst: Path, opset: int = 17) -> dict[str, Any]:
    """Export the model in ``src`` to ``dst`` (see the module docstring); returns what was exported:
    ``output_kind`` (embedding | logits), ``architecture``, ``output``, ``vocab_size``."""
    root = Path(src)
    tf = _transformers()
    import torch

    try:
        cfg = tf.AutoConfig.from_pretrained(root, local_files_only=True)
    except Exception as exc:
        raise LatencyLabError(f"--model {src}: config.json is not a readable transformers config: {exc}") from None
    archs = list(getattr(cfg, "architectures", None) or [])
    arch = archs[0] if archs else type(cfg).__name__
    if (
        getattr(cfg, "is_encoder_decoder", False)
        or getattr(cfg, "is_decoder", False)
        or any(a.endswith(_DECODERS) for a in archs)
    ):
        raise LatencyLabError(
            f"--model {src}: {arch} is a decoder or encoder-decoder; optimize --model exports encoders only: export "
            f"it yourself (optimum-cli export onnx --model {src} OUT/) and pass OUT/model.onnx"
        )
    classifier = any(a.endswith("ForSequenceClassification") for a in archs)
    try:
        if classifier:
            model = _load(tf.AutoModelForSequenceClassification, root).eval()

            class Logits(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.model = model

                def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                    return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

            module: Any = Logits().eval()
        else:
            from latencylab.workloads.text import embedding_module

            module = embedding_module(_load(tf.AutoModel, root).eval())
    except OSError as exc:  # no weights, or weights transformers cannot read
        raise LatencyLabError(f"--model {src}: cannot load the model's weights: {exc}") from None
    vocab = int(getattr(cfg, "vocab_size", 0) or 100)
    ids = torch.arange(EXPORT_SEQ, dtype=torch.int64).reshape(1, -1) % vocab
    mask = torch.ones_like(ids)
    dst.parent.mkdir(parents=True, exist_ok=True)
    output = "logits" if classifier else "embedding"
    import warnings

    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            (ids, mask),
            str(dst),
            input_names=["input_ids", "attention_mask"],
            output_names=[output],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                output: {0: "batch"},
            },
            opset_version=opset,
            dynamo=False,
        )
    return {
        "output_kind": "logits" if classifier else "embedding",
        "architecture": arch,
        "output": output,
        "vocab_size": vocab,
    }


__all__ = ["check_directory", "directory_digest", "export_directory", "is_hf_directory", "onnx_in_directory"]
