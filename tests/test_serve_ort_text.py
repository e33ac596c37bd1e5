"""The text model served through ONNX Runtime (variant ``fp32-onnx``): same answers as torch FP32, a cached
export, a wide session for long inputs, served end to end by the real app, clear errors for bad files."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from starlette.testclient import TestClient  # noqa: E402

from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.serve.app import build_state, lifespan_app  # noqa: E402
from latencylab.serve.config import ModelConfig, ServerConfig  # noqa: E402
from latencylab.serve.ort_text import OrtTextVariant, _session, ort_text_variant, text_onnx_path  # noqa: E402
from latencylab.serve.types import InferRequest, Tensor  # noqa: E402
from latencylab.serve.variants import build_variants  # noqa: E402
from latencylab.serve.variants_text import TextVariant  # noqa: E402
from latencylab.workloads.text import corpus  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TextVariant, OrtTextVariant]]:
    """torch fp32 and ORT fp32-onnx, the export made fresh in a private cache, 1 thread each."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LATENCYLAB_CACHE", str(tmp_path_factory.mktemp("ort-text-cache")))
        assert not text_onnx_path().exists()
        fp32, onnx = build_variants("text", ["fp32", "fp32-onnx"], max_batch_size=8)
        assert isinstance(fp32, TextVariant) and isinstance(onnx, OrtTextVariant)
        assert onnx.source == text_onnx_path() and onnx.path.is_file() and onnx.path != onnx.source  # fused
        yield fp32, onnx
    torch.set_num_threads(old)


def _request(texts: list[str]) -> InferRequest:
    data = np.empty(len(texts), dtype=object)
    data[:] = [t.encode() for t in texts]
    return InferRequest("text", None, (Tensor("TEXT", "BYTES", (len(texts),), data),))


def _embed(v: TextVariant, texts: list[str]) -> np.ndarray:
    items = [v.preprocess(_request([t])) for t in texts]
    return v.forward(items).embeddings


def test_onnx_rung_answers_as_torch_fp32_over_the_corpus(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    fp32, onnx = pair
    texts = list(corpus())[::4]  # 150 texts, 5-256 tokens, batched 8 at a time with length groups
    for start in range(0, len(texts), 8):
        chunk = texts[start : start + 8]
        a, b = _embed(fp32, chunk), _embed(onnx, chunk)
        cos = (a * b).sum(axis=1)
        assert cos.min() > 0.99999, (start, cos.min())
        assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert onnx.kind == "primary" and onnx.split_cost_tokens < fp32.split_cost_tokens


def test_export_is_cached_and_reused(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    _, onnx = pair
    stamp = onnx.path.stat().st_mtime_ns
    again = ort_text_variant("again", "primary", onnx.tokenizer, threads=1)  # neither exported nor fused again
    assert again.path == onnx.path and again.path.stat().st_mtime_ns == stamp
    # the export and its fused graph, no temporary file left behind
    assert sorted(p.name for p in onnx.path.parent.iterdir()) == sorted([onnx.source.name, onnx.path.name])


def test_long_inputs_run_on_the_wide_session(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    _, onnx = pair
    v = ort_text_variant("wide", "primary", onnx.tokenizer, path=onnx.path, threads=1, fuse=False)
    long_text = max(corpus(), key=len)
    base = _embed(v, ["short one", long_text])
    used: list[int] = []
    v.wide_threads, v.wide_tokens = 2, 96
    assert v.wide_threads == 2 and v._wide is not None
    for name in ("session", "_wide"):
        sess = getattr(v, name)

        class Spy:
            def __init__(self, inner: object, n: int) -> None:
                self.inner, self.n = inner, n

            def run(self, *a: object, **k: object) -> object:
                used.append(self.n)
                return self.inner.run(*a, **k)  # type: ignore[attr-defined]

        setattr(v, name, Spy(sess, 1 if name == "session" else 2))
    wide = _embed(v, ["short one", long_text])
    assert sorted(used) == [1, 2]  # the short group on 1 thread, the long one on the wide session
    assert ((base * wide).sum(axis=1) > 0.99999).all()
    v.wide_threads = None
    assert v._wide is None


def _idle_cpu_s(session: Any, sleep_s: float = 0.3) -> float:
    """CPU the whole process uses while this thread sleeps, right after one call on ``session``."""
    n = 64
    session.run(None, {"input_ids": np.full((1, n), 1000, np.int64), "attention_mask": np.ones((1, n), np.int64)})
    c0 = time.process_time()
    time.sleep(sleep_s)
    return time.process_time() - c0


def test_ort_spin_us_caps_how_long_idle_threads_spin(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    """ORT's own default keeps an idle 2-thread session's worker spinning for ~40 ms of CPU after a call; with
    ``spin_us`` it sleeps after 1 ms, so the process is nearly idle while nothing is computed."""
    _, onnx = pair
    default, capped = _session(onnx.path, 2), _session(onnx.path, 2, spin_us=1000)
    spun = sorted(_idle_cpu_s(default) for _ in range(3))[1]
    rested = sorted(_idle_cpu_s(capped) for _ in range(3))[1]
    assert rested < 0.03, f"capped at 1 ms, the idle process still used {rested * 1e3:.1f} ms of CPU in 300 ms"
    assert spun > 2 * rested + 0.015, f"default {spun * 1e3:.1f} ms vs capped {rested * 1e3:.1f} ms: no spinning?"


def test_ort_spin_us_from_the_config_reaches_the_sessions(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    _, onnx = pair
    v = ort_text_variant("spin", "primary", onnx.tokenizer, path=onnx.path, threads=1, fuse=False)
    cfg = ServerConfig(models=(ModelConfig(name="text", ladder=("spin",), ort_spin_us=1500, long_input_threads=2),))
    build_state(cfg, {"text": [v]})
    assert v.spin_us == 1500 and v._wide is not None
    for sess in (v.session, v._wide):
        assert sess.get_session_options().get_session_config_entry("session.intra_op.spin_duration_us") == "1500"
    with pytest.raises(LatencyLabError, match="ort_spin_us must be"):
        ModelConfig(name="text", ladder=("spin",), ort_spin_us=-1)


def test_ort_threads_from_the_config_rebuild_the_session(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    """``ort_threads`` sets the session's intra-op threads whatever the variant was built with (the server's
    --threads): two compute workers can then each run a 1-thread forward. Answers do not change."""
    _, onnx = pair
    v = ort_text_variant("t", "primary", onnx.tokenizer, path=onnx.path, threads=2, fuse=False)
    item = v.preprocess(_request(["a sentence to embed, the same under any thread count"]))
    before = v.postprocess(v.forward([item]), 1)[0][0].data
    cfg = ServerConfig(models=(ModelConfig(name="text", ladder=("t",), ort_threads=1, compute_workers=2),))
    build_state(cfg, {"text": [v]})
    assert v.intra_op_threads == 1
    assert v.session.get_session_options().intra_op_num_threads == 1
    np.testing.assert_allclose(v.postprocess(v.forward([item]), 1)[0][0].data, before, atol=1e-5)
    for bad in (0, True, 1.5):
        with pytest.raises(LatencyLabError, match="ort_threads must be"):
            ModelConfig(name="text", ladder=("t",), ort_threads=bad)  # type: ignore[arg-type]


def test_served_end_to_end_by_the_app(pair: tuple[TextVariant, OrtTextVariant]) -> None:
    fp32, onnx = pair
    cfg = ServerConfig(models=(ModelConfig(name="text", ladder=("fp32-onnx",), max_batch_size=8),))
    state = build_state(cfg, {"text": [onnx]})
    text = "Where does inference time go?"
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    with TestClient(lifespan_app(state)) as client:
        r = client.post("/v2/models/text/infer", json=body)
        assert r.status_code == 200, r.text
        d = r.json()
    assert d["model_version"] == "fp32-onnx"
    got = np.asarray(d["outputs"][0]["data"], dtype=np.float32).reshape(d["outputs"][0]["shape"])
    want = _embed(fp32, [text])
    assert got.shape == (1, 384) and float((got * want).sum()) > 0.99999


def test_bad_model_files_are_clear_errors(tmp_path: Path, pair: tuple[TextVariant, OrtTextVariant]) -> None:
    _, onnx = pair
    with pytest.raises(LatencyLabError, match="no such ONNX model file"):
        ort_text_variant("x", "primary", onnx.tokenizer, path=tmp_path / "missing.onnx")
    with pytest.raises(LatencyLabError, match=r"needs its \(attention heads"):
        ort_text_variant("x", "primary", onnx.tokenizer, path=onnx.source)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf")
    with pytest.raises(LatencyLabError, match="ONNX Runtime cannot load it"):
        ort_text_variant("x", "primary", onnx.tokenizer, path=junk, fuse=False)


def test_a_graph_without_text_inputs_is_refused(tmp_path: Path, pair: tuple[TextVariant, OrtTextVariant]) -> None:
    import onnx
    from onnx import TensorProto, helper

    _, ort_v = pair
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", [x], [y])
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(LatencyLabError, match="takes input_ids and attention_mask"):
        ort_text_variant("x", "primary", ort_v.tokenizer, path=path, fuse=False)
