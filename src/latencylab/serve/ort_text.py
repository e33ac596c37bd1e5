"""The text model served through ONNX Runtime: the same MiniLM weights, exported once, run by ORT.

``fp32-onnx`` is the FP32 ``fp32`` rung's model exported to ONNX (encoder +
masked mean pooling + L2 normalisation, dynamic batch and sequence axes) and
run by an ONNX Runtime CPU session. Its embeddings are the torch rung's up to
float rounding (cosine 1.000000 over the shipped corpus; the tests assert
it). Any ONNX graph with the same interface (``input_ids``, ``attention_mask``
int64 -> one (rows, hidden) float embedding), e.g. the text model that
``latencylab optimize --out`` exports, can be served with
:func:`ort_text_variant` (``latencylab serve --from DIR`` does it for every rung
of an optimize output directory: serve/from_optimize.py).

Why a second runtime for the same model (reference 2-vCPU VM, one 208-token passage, the corpus's p99
length): the eager-attention export runs in 36-39 ms on 2 ORT threads (fused or not) against 59 ms for
the SDPA export and 55-69 ms for torch eager on 2 threads. ORT's parallel loops hand out work in chunks
that the calling thread shares, so one descheduled thread delays a call less than OpenMP's static split
does (a 256-token passage while another process takes half a core: 60-66 ms against 96-126 ms for torch);
and a session call releases the GIL for the whole forward, not once per operator. The fused graph
(``fp32-onnx``; ``fp32-onnx-unfused`` serves the plain export) mostly shortens short inputs (a 17-token
text: 4.6 ms against 7.0-7.5 ms on 2 threads), where the fixed cost per operator dominates.

The export is cached under ``$LATENCYLAB_CACHE/serve`` (default
``~/.cache/latencylab/serve``), keyed by the weights' bytes and the torch and
transformers versions, and written atomically (a temporary file renamed into
place), so servers starting at once never read half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.families.onnxruntime.common import GRAPH_LEVELS, _ort, session_options
from latencylab.serve.variants_text import TextVariant

__all__ = [
    "GRAPH_LEVELS",
    "OrtSessionKnobs",
    "OrtTextVariant",
    "export_default",
    "export_text_onnx",
    "fused_onnx",
    "ort_session",
    "ort_text_variant",
    "text_onnx_path",
]

OPSET = 17
# One more ORT call costs about as much as this many padded tokens (1 thread, MiniLM-L6, reference VM):
# a call's fixed cost is far below torch eager's (Python per operator), so length groups split sooner.
SPLIT_COST_TOKENS_ORT = 16


def _weights_digest() -> str:
    from latencylab.workloads.text import model_dir

    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        with (model_dir() / name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def text_onnx_path() -> Path:
    """Where the FP32 MiniLM export of this install lives (it may not exist yet)."""
    import torch
    import transformers

    from latencylab.workloads.digits_cnn import cache_dir

    key = hashlib.sha256(
        f"{_weights_digest()}|torch {torch.__version__}|transformers {transformers.__version__}|opset {OPSET}"
        "|attention eager".encode()
    ).hexdigest()[:16]
    return cache_dir() / "serve" / f"minilm-l6-fp32-{key}.onnx"


def export_default(path: Path) -> Path:
    """Export the packaged MiniLM to ``path`` with eager attention (see :func:`export_text_onnx`)."""
    from latencylab.workloads.text import load_model

    return export_text_onnx(*load_model(attn="eager"), path)


def _packaged_shape() -> tuple[int, int]:
    """(attention heads, hidden size) of the packaged MiniLM, from its config.json."""
    import json

    from latencylab.workloads.text import model_dir

    cfg = json.loads((model_dir() / "config.json").read_text(encoding="utf-8"))
    return int(cfg["num_attention_heads"]), int(cfg["hidden_size"])


def fused_onnx(src: Path, heads: int, hidden: int) -> Path:
    """ONNX Runtime's transformer optimizer applied to ``src`` (cached beside it, atomic), or ``src`` itself
    when the optimizer finds no attention to fuse.

    The optimizer rewrites the BERT subgraphs into ORT's fused CPU kernels (EmbedLayerNormalization,
    Attention, SkipLayerNormalization, BiasGelu): the same FP32 arithmetic in fewer, larger kernels.
    """
    ort = _ort()
    dst = src.with_name(f"{src.stem}-fused-h{heads}x{hidden}-ort{ort.__version__}.onnx")
    if dst.is_file():
        return dst
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden, use_gpu=False)
    if not opt.get_fused_operator_statistics().get("Attention"):
        return src
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=dst.parent)
    os.close(fd)
    try:
        opt.save_model_to_file(tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dst


def export_text_onnx(tokenizer: Any, encoder: Any, path: Path) -> Path:
    """Export ``encoder`` + masked mean pooling + L2 normalisation to ``path`` (atomic), FP32, dynamic axes.

    Export an encoder loaded with eager attention (``load_model(attn="eager")``): its graph is plain
    MatMul/Softmax that ORT parallelises and fuses. The SDPA export runs a 208-token passage in about the
    same time as eager on one thread but gains almost nothing from a second one (58.7 ms against 36.3 ms on
    2 threads, reference VM), and ORT's transformer optimizer cannot fuse its attention.
    """
    import torch

    from latencylab.workloads.text import embedding_module, export_embedding_onnx

    enc = tokenizer(["a short one", "a somewhat longer example sentence for the export"], padding=True)
    args = tuple(torch.tensor(enc[n], dtype=torch.int64) for n in ("input_ids", "attention_mask"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        export_embedding_onnx(embedding_module(encoder), args, tmp, OPSET)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def ort_session(path: Path, threads: int, spin_us: int | None = None, graph: str = "all") -> Any:
    """A CPU session over ``path``: ``threads`` intra-op threads, sequential, graph optimisation ``graph`` (one of
    :data:`GRAPH_LEVELS`; a recipe's ``graph_optimization`` is served at the level it was measured at)."""
    so = session_options(max(1, int(threads)), graph)
    # ORT's default, spinning workers, kept on purpose: with them asleep between operators every parallel
    # section pays a wake-up, and a served request mostly arrives to a sleeping pool (measured, 2 threads,
    # one request every 20 ms: a 17-token text 5.2-5.3 ms spinning against 7.2-8.6 ms not; a 208-token
    # passage, fused graph, 35.9 against 43.8 ms).
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if spin_us is not None:
        # How long an idle worker spins before it sleeps. ORT's own default spins through the gaps of a served
        # load (measured, 2 threads, a 16-token text every 28 ms on average: 34 ms of CPU per 5-ms call). A cap
        # frees that core for a neighbour; below the gap between requests each call pays a wake-up again
        # (1000 us: p50 9.0 ms against 5.4; docs/BENCHMARKS.md, "ONNX Runtime's idle threads").
        so.add_session_config_entry("session.intra_op.spin_duration_us", str(int(spin_us)))
    try:
        return _ort().InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for unreadable/invalid models
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise LatencyLabError(f"{path}: ONNX Runtime cannot load it ({type(exc).__name__}: {first})") from None


_session = ort_session  # the name tests and older callers use


class OrtSessionKnobs:
    """The thread knobs of an ONNX Runtime rung (the config's ``ort_threads`` and ``ort_spin_us``); setting one
    rebuilds the session(s) through ``_rebuild`` (``spin``: the spin cap changed, so any second session too)."""

    threads: int
    _spin_us: int | None

    def _rebuild(self, spin: bool = False) -> None:
        raise NotImplementedError

    @property
    def spin_us(self) -> int | None:
        """How long idle intra-op threads spin before they sleep (None: ORT's default); setting it rebuilds
        the session(s)."""
        return self._spin_us

    @spin_us.setter
    def spin_us(self, us: int | None) -> None:
        self._spin_us = us
        self._rebuild(spin=True)

    @property
    def intra_op_threads(self) -> int:
        """The session's intra-op thread count; setting it rebuilds the session (the config's ``ort_threads``)."""
        return self.threads

    @intra_op_threads.setter
    def intra_op_threads(self, n: int) -> None:
        self.threads = max(1, int(n))
        self._rebuild()


class CpuTextVariant(TextVariant):
    """What every text variant over a CPU runtime's file (ONNX Runtime here, OpenVINO in serve/ov_runner.py)
    shares: ``threads`` and an empty ``provenance`` (``serve --from`` fills it) set before :class:`TextVariant`
    binds the model (``_bind`` reads them), and a refusal of any device but the CPU, naming ``RUNTIME``."""

    RUNTIME = "CPU runtime"

    def __init__(self, name: str, kind: str, tokenizer: Any, path: Path, *, threads: int = 1, **kw: Any) -> None:
        self.threads = max(1, int(threads))
        self.provenance: dict[str, Any] = {}
        super().__init__(name, kind, tokenizer, path, **kw)
        if self.device != "cpu":
            raise LatencyLabError(f"variant {name!r}: the {self.RUNTIME} text variant runs on the CPU only")


class OrtTextVariant(OrtSessionKnobs, CpuTextVariant):
    """A :class:`TextVariant` whose encoder is an ONNX Runtime session (CPU) over an embedding graph.

    The graph takes ``input_ids`` and ``attention_mask`` (int64, (rows, seq)) and returns (rows, hidden)
    L2-normalised embeddings. Tokenisation, length groups, batching and postprocessing are the torch
    variant's. ``threads`` is the session's intra-op thread count; setting ``wide_threads`` (the config's
    ``long_input_threads``) adds a second session on that many threads for groups whose longest text has
    at least ``wide_tokens`` tokens.
    """

    RUNTIME = "ONNX Runtime"

    def __init__(
        self,
        name: str,
        kind: str,
        tokenizer: Any,
        path: Path,
        *,
        threads: int = 1,
        fuse: tuple[int, int] | None = None,
        graph: str = "all",
        **kw: Any,
    ) -> None:
        self.source = Path(path)
        self.path = fused_onnx(self.source, *fuse) if fuse else self.source
        self.graph = graph
        self._wide: Any = None
        self._wide_threads: int | None = None
        self._spin_us: int | None = None
        kw.setdefault("split_cost_tokens", SPLIT_COST_TOKENS_ORT)
        super().__init__(name, kind, tokenizer, self.path, threads=threads, **kw)

    def _bind(self, model: Any) -> int:
        self.session = ort_session(Path(model), self.threads, self._spin_us, self.graph)
        inputs = {i.name for i in self.session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= inputs:
            raise LatencyLabError(
                f"{model}: an ONNX text model takes input_ids and attention_mask; this one takes {sorted(inputs)}"
            )
        width = self.session.get_outputs()[0].shape[-1]
        if not isinstance(width, int):
            raise LatencyLabError(f"{model}: the embedding's last dimension must be fixed, got {width!r}")
        self.module = None
        return width

    def _rebuild(self, spin: bool = False) -> None:
        self.session = ort_session(self.path, self.threads, self._spin_us, self.graph)
        if spin and self._wide is not None and self._wide_threads:
            self._wide = ort_session(self.path, self._wide_threads, self._spin_us, self.graph)

    @property
    def wide_threads(self) -> int | None:
        return self._wide_threads

    @wide_threads.setter
    def wide_threads(self, n: int | None) -> None:
        self._wide_threads = n
        self._wide = ort_session(self.path, n, self._spin_us, self.graph) if n and n != self.threads else None

    def _encode(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        session = self._wide if self._wide is not None and input_ids.shape[1] >= self.wide_tokens else self.session
        out = session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]
        return np.asarray(out, dtype=np.float32)


def ort_text_variant(
    name: str,
    kind: str,
    tokenizer: Any,
    *,
    path: Path | None = None,
    threads: int | None = None,
    fuse: bool = True,
    heads_hidden: tuple[int, int] | None = None,
    **kw: Any,
) -> OrtTextVariant:
    """An ORT text variant over ``path``, or over the cached FP32 export of the packaged model (exported if
    missing). ``fuse``: serve the transformer optimizer's fused graph of it (made once, cached); it needs the
    BERT's (attention heads, hidden size): ``heads_hidden``, known for the packaged model. Other keywords go to
    :class:`OrtTextVariant` (e.g. ``graph``, the session's graph optimisation level)."""
    if path is None:
        heads_hidden = heads_hidden or _packaged_shape()
        path = text_onnx_path()
        if not path.is_file():
            export_default(path)
    elif not Path(path).is_file():
        raise LatencyLabError(f"{path}: no such ONNX model file")
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    if fuse and heads_hidden is None:
        raise LatencyLabError(f"{path}: fusing a BERT graph needs its (attention heads, hidden size)")
    return OrtTextVariant(name, kind, tokenizer, Path(path), threads=threads, fuse=heads_hidden if fuse else None, **kw)
