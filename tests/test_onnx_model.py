"""The ``--model path.onnx`` workload, against real ONNX models built at test time."""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.workloads import WorkloadOptions, build_workload
from latencylab.workloads.onnx_model import build
from latencylab.workloads.onnx_spec import DEFAULT_DIM, INT_HIGH, POOL_SIZE

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)


def _save(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = ()) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _mlp(path: Path, batch: str | int = "batch") -> Path:
    """y = relu(x @ W + b), x: [batch, 4]."""
    return _save(
        path,
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(B, "b")],
    )


def _ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    zero = onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero")
    return {
        "mlp": _mlp(d / "mlp.onnx"),
        "static": _mlp(d / "static.onnx", batch=1),
        # masked: Where(mask, x, 0); both inputs share the symbolic "seq"
        "masked": _save(
            d / "masked.onnx",
            [helper.make_node("Where", ["mask", "x", "zero"], ["y"])],
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "seq"]),
                helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", "seq"]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "seq"])],
            [zero],
        ),
        # an input whose dims are unnamed and unknown
        "unnamed": _save(
            d / "unnamed.onnx",
            [helper.make_node("Relu", ["input.1"], ["y"])],
            [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [None, None])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
        ),
        # fails at run time unless the element count is a multiple of 3
        "reshape3": _save(
            d / "reshape3.onnx",
            [helper.make_node("Reshape", ["x", "shape"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
            [onnx.numpy_helper.from_array(np.array([-1, 3], np.int64), "shape")],
        ),
    }


@pytest.fixture(scope="module")
def torch_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    torch: Any = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(INT_HIGH, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, ids: Any, x: Any) -> Any:
            return torch.tanh(self.emb(ids).mean(dim=1) + self.lin(x))

    torch.manual_seed(0)
    net = Net().eval()
    path = tmp_path_factory.mktemp("torch") / "net.onnx"
    example = (torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is deprecated
        torch.onnx.export(
            net,
            example,
            str(path),
            dynamo=False,  # the dynamo exporter needs onnxscript, which is not installed
            opset_version=17,
            input_names=["ids", "x"],
            output_names=["out"],
            dynamic_axes={"ids": {0: "batch", 1: "seq"}, "x": {0: "batch"}, "out": {0: "batch"}},
        )
    return path, net


def _opts(model: Path | str | None, **kw: Any) -> WorkloadOptions:
    return WorkloadOptions(model_path=None if model is None else str(model), **kw)


# ---------------------------------------------------------------- behaviour


def test_forward_matches_numpy_on_generated_inputs(models: dict[str, Path]) -> None:
    pipe = build(_opts(models["mlp"], batch_size=3, seed=7))
    assert pipe.name == "mlp"
    assert pipe.stage_names == ("forward",)
    assert pipe.stages[0].kind == "forward"
    assert pipe.device == "cpu"
    feed = pipe.source(0)
    assert set(feed) == {"x"}
    assert feed["x"].shape == (3, 4) and feed["x"].dtype == np.float32
    (y,) = pipe.run_once(0)
    np.testing.assert_allclose(y, _ref(feed["x"]), rtol=1e-6, atol=1e-6)
    z = feed["x"] @ W + B
    assert (z < 0).any() and (y[z < 0] == 0).all()  # the input exercises the Relu


def test_generated_pool_is_seeded_and_cycles(models: dict[str, Path]) -> None:
    a = build(_opts(models["mlp"], seed=1))
    b = build(_opts(models["mlp"], seed=1))
    c = build(_opts(models["mlp"], seed=2))
    assert a.metadata["pool_size"] == POOL_SIZE
    np.testing.assert_array_equal(a.source(5)["x"], b.source(5)["x"])
    assert not np.array_equal(a.source(5)["x"], c.source(5)["x"])
    assert not np.array_equal(a.source(0)["x"], a.source(1)["x"])
    assert a.source(POOL_SIZE + 3) is a.source(3)  # pre-generated: source(i) is a lookup
    # standard normal, not constants
    xs = np.concatenate([a.source(i)["x"] for i in range(POOL_SIZE)])
    assert abs(float(xs.mean())) < 0.3 and 0.7 < float(xs.std()) < 1.3


def test_metadata_describes_model_and_session(models: dict[str, Path]) -> None:
    path = models["mlp"]
    pipe = build(_opts(path, batch_size=2))
    md = pipe.metadata
    assert md["model_path"] == str(path.resolve())
    assert md["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert md["opset"] == 17
    assert md["producer"] == "tests"
    assert md["inputs"] == [{"name": "x", "shape": ["batch", 4], "dtype": "tensor(float)", "fed_shape": [2, 4]}]
    assert md["outputs"] == [{"name": "y", "shape": ["batch", 3], "dtype": "tensor(float)", "sample_shape": [2, 3]}]
    assert md["providers"] == ["CPUExecutionProvider"]
    assert md["graph_optimization_level"] == "all"
    assert md["threads"] == 0
    assert any("threads=0" in n for n in md["notes"])
    assert md["input_origin"] == "generated" and md["inputs_path"] is None
    assert md["batch_size"] == 2
    json.dumps(pipe.describe())  # results must serialise


@pytest.mark.parametrize(("threads", "level"), [("1", "disable"), ("2", "basic"), ("1", "extended")])
def test_threads_and_opt_level_are_read_back_from_the_session(
    models: dict[str, Path], threads: str, level: str
) -> None:
    pipe = build(_opts(models["mlp"], params={"threads": threads, "opt_level": level}))
    assert pipe.metadata["threads"] == int(threads)
    assert pipe.metadata["graph_optimization_level"] == level
    np.testing.assert_allclose(pipe.run_once(0)[0], _ref(pipe.source(0)["x"]), rtol=1e-6, atol=1e-6)


def test_registry_builds_the_onnx_workload(models: dict[str, Path]) -> None:
    pipe = build_workload("onnx", _opts(models["mlp"]))
    assert pipe.name == "mlp" and pipe.stage_names == ("forward",)


def test_torch_export_matches_torch(torch_model: tuple[Path, Any]) -> None:
    import torch

    path, net = torch_model
    pipe = build(_opts(path, batch_size=2, seed=3, params={"dim.seq": "5", "threads": "1"}))
    feed = pipe.source(0)
    assert feed["ids"].shape == (2, 5) and feed["ids"].dtype == np.int64
    assert feed["x"].shape == (2, 8) and feed["x"].dtype == np.float32
    ids = np.stack([pipe.source(i)["ids"] for i in range(POOL_SIZE)])
    assert ids.min() >= 0 and ids.max() <= INT_HIGH - 1 and len(np.unique(ids)) > 50
    # the ids index a 100-row embedding table: drawn from its rows, and the rule is written down
    assert any("'ids'" in n and "0..99" in n and "100 rows of the embedding table" in n for n in pipe.metadata["notes"])
    (out,) = pipe.run_once(0)
    with torch.no_grad():
        want = net(torch.from_numpy(feed["ids"]), torch.from_numpy(feed["x"])).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert pipe.metadata["inputs"][0]["shape"] == ["batch", "seq"]


def test_unset_symbolic_dims_default_and_are_shared(models: dict[str, Path]) -> None:
    pipe = build(_opts(models["masked"], batch_size=4))
    feed = pipe.source(0)
    assert feed["x"].shape == feed["mask"].shape == (4, DEFAULT_DIM)
    assert feed["mask"].dtype == np.bool_ and feed["mask"].all()  # a mask: every position attended
    assert any("'seq'" in n and "dim.seq" in n for n in pipe.metadata["notes"])
    assert pipe.metadata["guessed_dims"] == {"seq": DEFAULT_DIM}
    (y,) = pipe.run_once(0)
    np.testing.assert_array_equal(y, np.where(feed["mask"], feed["x"], 0))


def test_unnamed_dim_is_addressed_by_input_and_axis(models: dict[str, Path]) -> None:
    pipe = build(_opts(models["unnamed"], batch_size=2, params={"dim.input.1.1": "5"}))
    assert pipe.source(0)["input.1"].shape == (2, 5)
    assert pipe.metadata["inputs"][0]["shape"] == [None, None]


def test_npz_rows_are_stacked_into_batches(models: dict[str, Path], tmp_path: Path) -> None:
    rows = np.arange(20, dtype=np.float32).reshape(5, 4) - 10
    np.savez(tmp_path / "in.npz", x=rows, unused=np.zeros(3))
    pipe = build(_opts(models["mlp"], batch_size=2, inputs_path=str(tmp_path / "in.npz")))
    expected = [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4], [0, 1]]
    for i, idx in enumerate(expected):
        np.testing.assert_array_equal(pipe.source(i)["x"], rows[idx])
    np.testing.assert_allclose(pipe.run_once(2)[0], _ref(rows[[4, 0]]), rtol=1e-6, atol=1e-6)
    md = pipe.metadata
    assert md["input_origin"] == "npz" and md["inputs_path"] == str((tmp_path / "in.npz").resolve())
    assert md["pool_size"] == 5  # batches repeat every 5
    assert md["inputs"][0]["fed_shape"] == [2, 4]


def test_npz_with_exact_input_shape_is_one_sample(models: dict[str, Path], tmp_path: Path) -> None:
    x = np.linspace(-1, 1, 4).reshape(1, 4)  # float64: cast to the model's float32
    np.savez(tmp_path / "one.npz", x=x)
    pipe = build(_opts(models["static"], inputs_path=str(tmp_path / "one.npz")))
    for i in range(3):
        feed = pipe.source(i)
        assert feed["x"].dtype == np.float32
        np.testing.assert_array_equal(feed["x"], x.astype(np.float32))
    assert any("cast from float64 to float32" in n for n in pipe.metadata["notes"])
    np.testing.assert_allclose(pipe.run_once(0)[0], _ref(x.astype(np.float32)), rtol=1e-6, atol=1e-6)


def test_npz_rows_feed_a_fixed_batch_model_one_at_a_time(models: dict[str, Path], tmp_path: Path) -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "rows.npz", x=rows)
    pipe = build(_opts(models["static"], inputs_path=str(tmp_path / "rows.npz")))
    for i in range(5):
        np.testing.assert_array_equal(pipe.source(i)["x"], rows[[i % 3]])
    assert pipe.metadata["pool_size"] == 3


def test_npz_int32_token_ids_feed_an_int64_model(torch_model: tuple[Path, Any], tmp_path: Path) -> None:
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = np.ones((3, 8), np.float32)
    np.savez(tmp_path / "tok.npz", ids=ids, x=x)
    pipe = build(_opts(torch_model[0], batch_size=3, inputs_path=str(tmp_path / "tok.npz")))
    np.testing.assert_array_equal(pipe.source(0)["ids"], ids.astype(np.int64))
    assert pipe.metadata["inputs"][0]["fed_shape"] == [3, 4]


# ---------------------------------------------------------------- errors


def _raises(opts: WorkloadOptions, *phrases: str, exc: type[Exception] = LatencyLabError) -> str:
    with pytest.raises(exc) as info:
        build(opts)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for p in phrases:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


def test_model_path_errors(tmp_path: Path) -> None:
    _raises(_opts(None), "needs a model file")
    _raises(_opts(tmp_path / "nope.onnx"), "nope.onnx", "not found")
    _raises(_opts(tmp_path), "is a directory")
    (tmp_path / "empty.onnx").write_bytes(b"")
    _raises(_opts(tmp_path / "empty.onnx"), "empty.onnx", "is empty")
    (tmp_path / "noise.onnx").write_bytes(np.random.default_rng(0).bytes(512))
    _raises(_opts(tmp_path / "noise.onnx"), "cannot load ONNX model noise.onnx", "Protobuf parsing failed")
    (tmp_path / "notes.onnx").write_text("this is not a model\n" * 5)
    _raises(_opts(tmp_path / "notes.onnx"), "cannot load ONNX model notes.onnx")


def test_npz_file_errors(models: dict[str, Path], tmp_path: Path) -> None:
    mlp = models["mlp"]
    _raises(_opts(mlp, inputs_path=str(tmp_path / "gone.npz")), "gone.npz", "not found")
    _raises(_opts(mlp, inputs_path=str(tmp_path)), "is a directory")
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated zip")
    _raises(_opts(mlp, inputs_path=str(tmp_path / "bad.npz")), "bad.npz is not a readable .npz")
    (tmp_path / "text.npz").write_text("hello")
    _raises(_opts(mlp, inputs_path=str(tmp_path / "text.npz")), "text.npz is not a readable .npz")
    np.save(tmp_path / "single.npy", np.zeros((2, 4), np.float32))
    _raises(_opts(mlp, inputs_path=str(tmp_path / "single.npy")), "single array", "numpy.savez")
    np.savez(tmp_path / "other.npz", input=np.zeros((2, 4), np.float32))
    _raises(_opts(mlp, inputs_path=str(tmp_path / "other.npz")), "no array for model input(s) 'x'", "has: input")


@pytest.mark.parametrize(
    ("array", "phrases"),
    [
        (np.zeros((2, 4), np.int64), ("array 'x' has dtype int64", "expects float32")),
        (np.zeros((2, 4), np.bool_), ("dtype bool", "expects float32")),
        (np.zeros((2, 2, 4), np.float32), ("has rank 3", "rank 2", "first axis indexes samples")),
        (np.zeros(4, np.float32), ("has rank 1",)),
        (np.zeros((2, 5), np.float32), ("shape (2, 5)", "axis 1 must be 4")),
        (np.zeros((0, 4), np.float32), ("no samples",)),
    ],
)
def test_npz_content_errors(
    models: dict[str, Path], tmp_path: Path, array: np.ndarray, phrases: tuple[str, ...]
) -> None:
    np.savez(tmp_path / "in.npz", x=array)
    _raises(_opts(models["mlp"], inputs_path=str(tmp_path / "in.npz")), "in.npz", *phrases)


def test_npz_cross_array_errors(models: dict[str, Path], torch_model: tuple[Path, Any], tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros((2, 6), np.float32), mask=np.ones((2, 5), np.bool_))
    _raises(_opts(models["masked"], inputs_path=str(tmp_path / "a.npz")), "seq=5", "seq=6")
    np.savez(tmp_path / "b.npz", x=np.zeros((2, 6), np.float32), mask=np.ones((2, 6), np.bool_))
    _raises(
        _opts(models["masked"], inputs_path=str(tmp_path / "b.npz"), params={"dim.seq": "4"}),
        "seq=6",
        "dim.seq",
    )
    np.savez(tmp_path / "c.npz", ids=np.zeros((3, 4), np.int64), x=np.zeros((2, 8), np.float32))
    _raises(_opts(torch_model[0], inputs_path=str(tmp_path / "c.npz")), "different sample counts", "ids 3, x 2")
    np.savez(tmp_path / "d.npz", ids=np.full((3, 4), 2**40, np.int64), x=np.zeros((3, 8), np.float32))
    # in range for the int64 model but not a valid embedding row: onnxruntime's own error, one line
    _raises(_opts(torch_model[0], inputs_path=str(tmp_path / "d.npz")), "onnxruntime failed running net.onnx")


@pytest.mark.parametrize(
    ("params", "phrases"),
    [
        ({"opt_level": "max"}, ("opt_level='max'", "disable, basic, extended, all")),
        ({"threads": "two"}, ("threads='two' is not an integer",)),
        ({"threads": "-1"}, ("threads=-1 must be >= 0",)),
        ({"dim.seq": "-3"}, ("dim.seq=-3 must be >= 1",)),
        ({"dim.seq": "0"}, ("dim.seq=0 must be >= 1",)),
        (
            {"thread": "1"},
            ("unknown onnx workload param 'thread'", "threads, opt_level, provider, dim.<name>"),
        ),
        ({"dim.": "1"}, ("unknown onnx workload param 'dim.'",)),
        ({"dim.len": "8"}, ("no symbolic dimension 'len'", "has: seq")),
        ({"dim.N": "8"}, ("'N' is the batch axis",)),
        ({"provider": "tpu"}, ("provider='tpu'", "cpu, cuda")),
    ],
)
def test_bad_params(models: dict[str, Path], params: dict[str, str], phrases: tuple[str, ...]) -> None:
    _raises(_opts(models["masked"], params=params), *phrases)


def test_batch_size_needs_a_dynamic_batch_axis(models: dict[str, Path]) -> None:
    _raises(_opts(models["static"], batch_size=4), "no dynamic batch axis", "x [1, 4]", "batch size 4")
    assert build(_opts(models["static"])).source(0)["x"].shape == (1, 4)


def test_run_time_failure_is_one_line(models: dict[str, Path]) -> None:
    _raises(_opts(models["reshape3"], params={"dim.n": "4"}), "onnxruntime failed running reshape3.onnx")
    pipe = build(_opts(models["reshape3"], params={"dim.n": "6"}))
    assert pipe.run_once(0)[0].shape == (2, 3)


def test_device_and_provider_errors(models: dict[str, Path]) -> None:
    import onnxruntime as ort

    _raises(_opts(models["mlp"], device="mps"), "device 'mps'")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        _raises(_opts(models["mlp"], params={"provider": "cuda"}), "CUDAExecutionProvider is not available")
        _raises(_opts(models["mlp"], device="cuda:0"), "onnxruntime-gpu")


def test_missing_onnxruntime_gives_install_hint(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    msg = _raises(_opts(models["mlp"]), "onnxruntime is not installed", exc=MissingDependencyError)
    assert "latencylab[onnx]" in msg


def test_string_input_is_rejected(models: dict[str, Path]) -> None:
    path = models["mlp"].with_name("strings.onnx")
    _save(
        path,
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["batch"])],
    )
    _raises(_opts(path), "model input 's' has type tensor(string)")


# ---------------------------------------------------------------- guessed inputs (issue 15, item 13)


@pytest.fixture(scope="module")
def tokens_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-like input signature: ids into a 37-row table (fewer than INT_HIGH), a mask, token types."""
    torch: Any = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = torch.nn.Embedding(37, 6)
            self.types = torch.nn.Embedding(2, 6)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            h = self.words(input_ids) + self.types(token_type_ids)
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tokens") / "tokens.onnx"
    example = tuple(torch.zeros(1, 5, dtype=torch.int64) for _ in range(3))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            Net().eval(), example, str(path), dynamo=False, opset_version=17, input_names=names,
            output_names=["out"], dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in names}, "out": {0: "batch"}},
        )  # fmt: skip
    return path


def test_guessed_token_inputs_follow_names_and_the_embedding_table(tokens_model: Path) -> None:
    """ids within the vocabulary read from the Gather's table (37 rows: random 0..99 would crash the Gather),
    masks 1, token types 0, the dim=N guess used, and every guess written down."""
    pipe = build(_opts(tokens_model, batch_size=2, params={"dim": "24"}))
    feeds = [pipe.source(i) for i in range(POOL_SIZE)]
    ids = np.stack([f["input_ids"] for f in feeds])
    assert ids.shape[1:] == (2, 24) and ids.min() >= 0 and ids.max() == 36  # the whole vocabulary, no more
    assert all((f["attention_mask"] == 1).all() and (f["token_type_ids"] == 0).all() for f in feeds)
    md = pipe.metadata
    assert md["guessed_dims"] == {"seq": 24}
    rules = {g["name"]: g["values"] for g in md["guessed"]}
    assert rules["input_ids"].startswith("random in 0..36 (the 37 rows of the embedding table")
    assert rules["attention_mask"].startswith("1 everywhere") and rules["token_type_ids"].startswith("0 everywhere")
    assert [g["shape"] for g in md["guessed"]] == [[2, 24]] * 3
    assert any(n == "dimension 'seq' set to 24 (dim=N; pass dim.seq=N to choose)" for n in md["notes"])
    assert np.isfinite(pipe.run_once(0)[0]).all()


def test_guess_rules_by_name() -> None:
    from latencylab.workloads.onnx_inputs import guess_rule
    from latencylab.workloads.onnx_spec import InputSpec

    def rule(name: str, dtype: str = "tensor(int64)", tables: dict[str, int] | None = None) -> Any:
        return guess_rule(InputSpec(name, ("b", "s"), dtype), (1, 8), tables or {})

    assert (rule("key_padding_mask", "tensor(bool)").kind, rule("key_padding_mask").value) == ("fill", 0)
    assert (rule("attention_mask", "tensor(float)").kind, rule("attention_mask", "tensor(float)").value) == ("fill", 1)
    assert rule("segment_ids").value == 0
    assert rule("position_ids").kind == "positions"
    assert (rule("input_ids", tables={"input_ids": 30522}).high, rule("input_ids").high) == (30522, INT_HIGH)
    assert rule("pixel_values", "tensor(float)").kind == "normal"


def test_a_failing_guess_names_the_dim_and_inputs_fix(tmp_path: Path) -> None:
    """x [batch, n] into a Gemm that needs n = 4: the guess n = 16 fails; the error names dim.n and --inputs."""
    path = _save(
        tmp_path / "gemm.onnx",
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(B, "b")],
    )
    msg = _raises(_opts(path), "onnxruntime failed running gemm.onnx", "x [1, 16]", "guessed n=16",
                  "--param dim.n=N", "--inputs FILE.npz")  # fmt: skip
    assert "GEMM" in msg.upper()
    np.testing.assert_allclose(build(_opts(path, params={"dim.n": "4"})).run_once(0)[0].shape, (1, 3))


def test_npz_samples_split_into_disjoint_batches(models: dict[str, Path], tmp_path: Path) -> None:
    from latencylab.workloads.onnx_model import open_model

    rows = np.arange(7 * 4, dtype=np.float32).reshape(7, 4)
    np.savez(tmp_path / "seven.npz", x=rows)
    m = open_model(_opts(models["mlp"], batch_size=2, inputs_path=str(tmp_path / "seven.npz")))
    assert m.npz is not None and m.npz.samples == 7 and m.npz.rows == 2
    held = m.npz.feeds([1, 2, 3])  # 3 samples at batch 2: the last batch completed from the subset's start
    assert [f["x"][:, 0].tolist() for f in held] == [[4.0, 8.0], [12.0, 4.0]]
    assert m.npz.feeds([]) == []
    assert (
        m.metadata["samples"] == 7
        and m.metadata["inputs_sha256"] == hashlib.sha256((tmp_path / "seven.npz").read_bytes()).hexdigest()
    )
