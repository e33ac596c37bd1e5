"""The built-in vision workload: real JPEGs, a real CNN, a real accuracy metric."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
PIL_Image = pytest.importorskip("PIL.Image")
pytest.importorskip("sklearn")

from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.pipeline import Pipeline  # noqa: E402
from latencylab.workloads import WorkloadOptions, build_workload, digits_cnn, vision  # noqa: E402


@dataclass(frozen=True)
class Trained:
    cache: Path
    pipe: Pipeline
    trained: digits_cnn.TrainedModel


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """Train the default model once, into a private cache directory."""
    cache = tmp_path_factory.mktemp("latencylab-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LATENCYLAB_CACHE", str(cache))
        result = vision.load_model(WorkloadOptions())
        pipe = build_workload("vision", WorkloadOptions())
        yield Trained(cache, pipe, result)


@pytest.fixture
def cache_env(trained: Trained, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LATENCYLAB_CACHE", str(trained.cache))
    return trained.cache


# ---------------------------------------------------------------- data


def test_test_jpegs_are_real_jpegs_of_the_requested_size() -> None:
    test = vision.heldout_set()
    assert len(test) == 360
    assert set(test.labels) == set(range(10))
    for data in test.jpegs[:20]:
        assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"  # SOI ... EOI markers
        img = PIL_Image.open(io.BytesIO(data))
        assert img.format == "JPEG" and img.mode == "RGB" and img.size == (224, 224)
    arrays = vision.decode(test.jpegs[0])
    assert len(arrays) == 1 and arrays[0].shape == (224, 224, 3) and arrays[0].dtype == np.uint8
    # Sensor noise makes these realistic-sized photos, not near-empty flat images.
    assert 5_000 < test.mean_bytes < 40_000


def test_size_param_sets_the_jpeg_side() -> None:
    test = vision.heldout_set(WorkloadOptions(params={"size": "40"}))
    assert PIL_Image.open(io.BytesIO(test.jpegs[0])).size == (40, 40)
    assert vision.decode(list(test.jpegs[:3]))[2].shape == (40, 40, 3)


def test_split_is_stratified_disjoint_and_deterministic() -> None:
    render = vision._splits.__wrapped__  # bypass the in-process cache
    train, test = render(32, 5, 90)
    again_train, again_test = render(32, 5, 90)
    assert train == again_train and test == again_test  # byte-identical JPEGs
    assert render(32, 6, 90)[1].jpegs != test.jpegs
    assert len(train) + len(test) == 1797 and not set(train.jpegs) & set(test.jpegs)
    train_counts = np.bincount(train.labels, minlength=10)
    test_counts = np.bincount(test.labels, minlength=10)
    fractions = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(fractions - 0.2) < 0.01)


def test_decode_rejects_bytes_that_are_not_an_image() -> None:
    with pytest.raises(LatencyLabError, match="not a decodable image"):
        vision.decode(b"definitely not a jpeg")


def test_preprocess_resizes_and_normalises_with_imagenet_statistics() -> None:
    white = np.full((224, 224, 3), 255, dtype=np.uint8)
    black = np.zeros((100, 80, 3), dtype=np.uint8)
    x = vision.Preprocess(64)([white, black])
    assert x.shape == (2, 3, 64, 64) and x.dtype == torch.float32 and x.is_contiguous()
    for c in range(3):
        assert torch.allclose(x[0, c], torch.tensor((1 - vision.MEAN[c]) / vision.STD[c]), atol=1e-5)
        assert torch.allclose(x[1, c], torch.tensor(-vision.MEAN[c] / vision.STD[c]), atol=1e-5)


# ---------------------------------------------------------------- pipeline


def test_pipeline_runs_end_to_end_and_returns_probabilities(trained: Trained) -> None:
    pipe = trained.pipe
    assert pipe.name == "vision" and pipe.device == "cpu"
    assert pipe.stage_names == ("decode", "preprocess", "forward", "postprocess")
    assert [s.kind for s in pipe.stages] == ["load", "preprocess", "forward", "postprocess"]
    test = vision.heldout_set()
    assert pipe.source(3) == test.jpegs[3]

    out = pipe.run_once(3)
    assert isinstance(out, vision.Predictions)
    assert out.probs.shape == (1, 10) and out.probs.dtype == np.float32
    assert np.all(out.probs >= 0) and out.probs.sum() == pytest.approx(1.0, abs=1e-5)
    assert out.class_ids.tolist() == [int(out.probs.argmax())]
    assert out.class_ids[0] == test.labels[3]


def test_metadata_describes_the_workload(trained: Trained) -> None:
    meta = trained.pipe.metadata
    forward = trained.pipe.stages[2].fn
    assert isinstance(forward, vision.Forward)
    model = forward.model
    assert meta["model"] == "digits-cnn"
    assert meta["params"] == sum(p.numel() for p in model.parameters()) == 26266
    assert meta["input_resolution"] == 64 and meta["jpeg_size"] == 224 and meta["jpeg_quality"] == 90
    assert meta["n_test_images"] == 360 and meta["batch_size"] == 1
    assert meta["test_accuracy"] == pytest.approx(trained.trained.test_accuracy, abs=1e-6)
    assert meta["weights"] == str(trained.trained.path)
    json.dumps(trained.pipe.describe())  # results must be JSON-serialisable


def test_accuracy_on_the_held_out_split(trained: Trained) -> None:
    acc = vision.evaluate_accuracy(trained.pipe)
    assert acc >= 0.95
    assert acc == pytest.approx(trained.trained.test_accuracy)  # what the cache recorded
    # Batching changes nothing but speed.
    assert vision.evaluate_accuracy(trained.pipe, batch_size=37) == pytest.approx(acc)


def test_accuracy_metric_can_fail(cache_env: Path) -> None:
    """A model that always answers 3 scores exactly the share of 3s in the test split."""
    always_three = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10))
    with torch.no_grad():
        always_three[1].weight.zero_()
        always_three[1].bias.copy_(torch.arange(10) == 3)
    pipe = vision.pipeline_for_model(always_three)
    test = vision.heldout_set()
    assert vision.evaluate_accuracy(pipe) == pytest.approx(test.labels.count(3) / len(test))


def test_batched_pipeline_stacks_images_and_matches_single_images(trained: Trained, cache_env: Path) -> None:
    pipe = build_workload("vision", WorkloadOptions(batch_size=4))
    test = vision.heldout_set()
    batch = pipe.source(1)
    assert batch == list(test.jpegs[4:8])
    assert pipe.source(90) == pipe.source(0)  # 360 images / 4 per batch: wraps around
    out = pipe.run_once(1)
    assert out.probs.shape == (4, 10) and out.class_ids.shape == (4,)
    singles = [trained.pipe.run_once(i) for i in range(4, 8)]
    np.testing.assert_allclose(out.probs, np.concatenate([s.probs for s in singles]), atol=1e-5)
    assert pipe.metadata["batch_size"] == 4


# ---------------------------------------------------------------- training and the weights cache


def test_training_is_reproducible_step_by_step() -> None:
    train, _ = vision.digits_jpeg_splits()
    images = vision.Preprocess(64)(vision.decode(train.jpegs[:128]))
    labels = torch.tensor(train.labels[:128])
    before = torch.get_rng_state()
    a = digits_cnn.train_model(digits_cnn.TrainConfig(seed=7), images, labels, max_steps=6)
    b = digits_cnn.train_model(digits_cnn.TrainConfig(seed=7), images, labels, max_steps=6)
    c = digits_cnn.train_model(digits_cnn.TrainConfig(seed=8), images, labels, max_steps=6)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG stream is untouched
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_cache_hit_loads_with_weights_only_and_predicts_the_same(
    trained: Trained, cache_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not trained.trained.from_cache and trained.trained.path.is_file()
    assert trained.trained.path.parent.parent == cache_env
    calls: list[dict[str, object]] = []
    real_load = torch.load

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    hit = vision.load_model(WorkloadOptions())
    assert hit.from_cache and hit.path == trained.trained.path
    assert calls and all(c.get("weights_only") is True for c in calls)
    assert hit.test_accuracy == trained.trained.test_accuracy
    old, new = trained.trained.model.state_dict(), hit.model.state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old)
    pipe = vision.pipeline_for_model(hit.model)
    for i in (0, 1, 2):
        np.testing.assert_array_equal(pipe.run_once(i).probs, trained.pipe.run_once(i).probs)


def test_cache_key_covers_what_decides_the_weights() -> None:
    data = {"size": 224}
    base = digits_cnn.cache_key(digits_cnn.TrainConfig(), data)
    assert base == digits_cnn.cache_key(digits_cnn.TrainConfig(), dict(data))
    assert base != digits_cnn.cache_key(digits_cnn.TrainConfig(seed=1), data)
    assert base != digits_cnn.cache_key(digits_cnn.TrainConfig(epochs=9), data)
    assert base != digits_cnn.cache_key(digits_cnn.TrainConfig(), {"size": 96})


def test_corrupt_cache_file_is_retrained_to_identical_weights(trained: Trained, cache_env: Path) -> None:
    """Also the full-length reproducibility check: retraining from scratch gives the same bits."""
    path = trained.trained.path
    path.write_bytes(b"\x00garbage, not a torch file")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        again = vision.load_model(WorkloadOptions())
    assert not again.from_cache and again.path == path
    old, new = trained.trained.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old)
    assert again.test_accuracy == trained.trained.test_accuracy
    assert vision.load_model(WorkloadOptions()).from_cache  # overwritten with a good file


def test_model_path_loads_a_saved_state_dict(trained: Trained, tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save(trained.trained.model.state_dict(), path)
    pipe = build_workload("vision", WorkloadOptions(model_path=str(path)))
    assert pipe.metadata["weights"] == str(path)
    assert pipe.metadata["test_accuracy"] == pytest.approx(trained.trained.test_accuracy)
    path.write_bytes(b"junk")
    with pytest.raises(LatencyLabError, match="cannot load digits-cnn weights"):
        build_workload("vision", WorkloadOptions(model_path=str(path)))


# ---------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (WorkloadOptions(params={"size": "big"}), "param size must be an integer, got 'big'"),
        (WorkloadOptions(params={"res": "4"}), r"param res must be in \[16, 512\], got 4"),
        (WorkloadOptions(params={"quality": "101"}), r"param quality must be in \[1, 100\]"),
        (
            WorkloadOptions(params={"colour": "1"}),
            "unknown param 'colour'; known params are quality, res, size",
        ),
        (WorkloadOptions(device="tpu"), "device must be cpu, cuda or cuda:N, got 'tpu'"),
        (WorkloadOptions(inputs_path="/tmp/x"), "inputs_path is not supported"),
    ],
)
def test_bad_options_raise_one_line_errors(opts: WorkloadOptions, message: str) -> None:
    with pytest.raises(LatencyLabError, match=message) as info:
        build_workload("vision", opts)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(LatencyLabError, match="CUDA is not available"):
        build_workload("vision", WorkloadOptions(device="cuda:0"))
