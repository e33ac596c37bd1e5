"""The built-in ``vision`` workload: JPEG bytes -> decode -> resize + normalise -> CNN -> softmax.

Everything is offline. The images are scikit-learn's bundled handwritten
digits (1797 labelled 8x8 greys), each rendered once into a realistic JPEG:
upscaled bilinearly to ``size`` x ``size`` RGB, tinted with a seeded ink and
paper colour, given a little seeded sensor noise (so that the entropy decoder
has real work to do) and encoded by Pillow at ``quality``. The pipeline
serves the held-out test split; its stages are the ones a production image
service runs, so decoding and resizing take a realistic share of the time
rather than the forward pass alone::

    decode      (load)         Pillow JPEG decode -> list of HxWx3 uint8 arrays
    preprocess  (preprocess)   resize to res x res, normalise -> float32 (N, 3, res, res)
    transfer    (transfer)     host -> device copy; only when the device is not the CPU
    forward     (forward)      the CNN under torch.inference_mode
    postprocess (postprocess)  softmax + argmax -> Predictions (numpy)

The model is trained on the training split through the very same decode and
preprocess functions (see :mod:`latencylab.workloads.digits_cnn`).

``params``: ``size`` (JPEG side, default 224), ``res`` (model input side,
default 64), ``quality`` (JPEG quality, default 90).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab.device import check_device
from latencylab.errors import LatencyLabError, require
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions, digits_cnn

if TYPE_CHECKING:
    import torch

# ImageNet statistics: what a production pipeline would normalise with.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TEST_FRACTION = 0.2
# Bump when _render_jpeg, decode or Preprocess changes what the model is trained on:
# it is part of the weights' cache key.
DATA_VERSION = 1
NOISE_HALF = 10  # uniform noise of +-10 grey levels (std 6) is added to every pixel before encoding

# key -> (default, lowest, highest)
PARAMS: dict[str, tuple[int, int, int]] = {
    "size": (224, 16, 2048),
    "res": (64, 16, 512),
    "quality": (90, 1, 100),
}


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """The workload's validated ``params``."""

    size: int = PARAMS["size"][0]
    res: int = PARAMS["res"][0]
    quality: int = PARAMS["quality"][0]

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> VisionSpec:
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise LatencyLabError(f"vision: unknown param {unknown[0]!r}; known params are {', '.join(sorted(PARAMS))}")
        values: dict[str, int] = {}
        for key, raw in params.items():
            _, lo, hi = PARAMS[key]
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise LatencyLabError(f"vision: param {key} must be an integer, got {raw!r}") from None
            if not lo <= value <= hi:
                raise LatencyLabError(f"vision: param {key} must be in [{lo}, {hi}], got {value}")
            values[key] = value
        return cls(**values)


@dataclass(frozen=True, slots=True)
class JpegSet:
    """Labelled JPEG images held in memory: ``jpegs[i]`` shows digit ``labels[i]``."""

    jpegs: tuple[bytes, ...]
    labels: tuple[int, ...]
    size: int

    def __post_init__(self) -> None:
        if len(self.jpegs) != len(self.labels):
            raise LatencyLabError(f"{len(self.jpegs)} JPEGs but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.jpegs)

    def indices(self, i: int, batch_size: int = 1) -> list[int]:
        """The indices of the i-th batch, wrapping around the set (as ``source(i)`` does)."""
        n = len(self.jpegs)
        return [(i * batch_size + k) % n for k in range(batch_size)]

    def batch(self, i: int, batch_size: int = 1) -> tuple[list[bytes], list[int]]:
        """The i-th batch of JPEGs and their labels, wrapping around the set."""
        idx = self.indices(i, batch_size)
        return [self.jpegs[j] for j in idx], [self.labels[j] for j in idx]

    @property
    def mean_bytes(self) -> float:
        return sum(len(b) for b in self.jpegs) / max(1, len(self.jpegs))


@dataclass(frozen=True, slots=True)
class Predictions:
    """What ``postprocess`` returns: ``class_ids`` (N,) int64 and ``probs`` (N, 10) float32."""

    class_ids: np.ndarray
    probs: np.ndarray


# ---------------------------------------------------------------- data


def digits_jpeg_splits(size: int = 224, seed: int = 0, quality: int = 90) -> tuple[JpegSet, JpegSet]:
    """(train, test): every sklearn digit rendered to JPEG, split stratified by ``seed``.

    Deterministic: the same arguments give the same bytes (for one Pillow /
    libjpeg build). Cached in process, since rendering 1797 JPEGs takes a
    second or more.
    """
    return _splits(int(size), int(seed), int(quality))


@functools.lru_cache(maxsize=4)
def _splits(size: int, seed: int, quality: int) -> tuple[JpegSet, JpegSet]:
    datasets = require("sklearn.datasets", "vision")
    model_selection = require("sklearn.model_selection", "vision")
    digits = datasets.load_digits()  # type: ignore[attr-defined]
    grey = np.asarray(digits.images, dtype=np.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    labels = np.asarray(digits.target, dtype=np.int64)
    rng = np.random.default_rng(seed)
    jpegs = [_render_jpeg(img, size, quality, rng) for img in grey]
    train_idx, test_idx = model_selection.train_test_split(  # type: ignore[attr-defined]
        np.arange(len(labels)), test_size=TEST_FRACTION, stratify=labels, random_state=seed
    )

    def subset(idx: np.ndarray) -> JpegSet:
        idx = np.sort(idx)
        return JpegSet(tuple(jpegs[i] for i in idx), tuple(int(labels[i]) for i in idx), size)

    return subset(train_idx), subset(test_idx)


def heldout_set(opts: WorkloadOptions | None = None) -> JpegSet:
    """The held-out JPEGs and labels that ``build(opts)`` serves and measures accuracy on."""
    opts = opts or WorkloadOptions()
    spec = VisionSpec.from_params(opts.params)
    return digits_jpeg_splits(spec.size, opts.seed, spec.quality)[1]


def _render_jpeg(grey: np.ndarray, size: int, quality: int, rng: np.random.Generator) -> bytes:
    from PIL import Image

    # Upscale the 8x8 ink map, then paint it through a lookup table that runs from a
    # seeded paper colour (ink 0) to a seeded ink colour (ink 255).
    ink_map = Image.fromarray(np.rint(grey * 255.0).astype(np.uint8))
    ink_map = ink_map.resize((size, size), Image.Resampling.BILINEAR)
    # Paper stays at most 255 - 2 * NOISE_HALF, so adding noise in [0, 2 * NOISE_HALF]
    # (zero-mean about a colour NOISE_HALF brighter) cannot overflow uint8.
    paper = rng.uniform(170.0, 255.0 - 2 * NOISE_HALF, size=3)
    ink = rng.uniform(0.0, 90.0, size=3)
    t = np.linspace(0.0, 1.0, 256)[:, None]
    lut = np.rint(paper * (1.0 - t) + ink * t).astype(np.uint8)  # (256, 3)
    pixels = lut.take(np.asarray(ink_map), axis=0)  # (size, size, 3)
    # Uniform per-pixel, per-channel sensor noise gives the entropy coder, and later the
    # decoder, real work: a flat bilinear blow-up of an 8x8 image would compress to nothing.
    pixels += rng.integers(0, 2 * NOISE_HALF + 1, size=pixels.shape, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


# ---------------------------------------------------------------- stages


def decode(jpegs: bytes | Sequence[bytes]) -> list[np.ndarray]:
    """Decode one JPEG (bytes) or a batch (a sequence of bytes) to HxWx3 uint8 RGB arrays."""
    from PIL import Image, UnidentifiedImageError

    batch = [jpegs] if isinstance(jpegs, bytes | bytearray | memoryview) else jpegs
    out = []
    for data in batch:
        try:
            img = Image.open(io.BytesIO(data))
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            out.append(np.asarray(rgb))  # forces the decode
        except (UnidentifiedImageError, OSError) as exc:
            raise LatencyLabError(f"decode: input is not a decodable image ({exc})") from exc
    return out


@dataclass(frozen=True, slots=True)
class Preprocess:
    """Resize each image to ``res`` x ``res`` (Pillow bilinear, antialiased) and normalise.

    Returns one float32 CPU tensor (N, 3, res, res): ``(pixel / 255 - MEAN) / STD``.
    The same object prepares the training data, so train and serve agree.
    """

    res: int

    def __call__(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        from PIL import Image

        torch = _torch()
        side = (self.res, self.res)
        resized = [
            np.asarray(Image.fromarray(a).resize(side, Image.Resampling.BILINEAR)) if a.shape[:2] != side else a
            for a in images
        ]
        x = np.stack(resized).astype(np.float32)  # (N, res, res, 3)
        # (x / 255 - mean) / std folded into one multiply and one subtract.
        x *= _SCALE
        x -= _SHIFT
        return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


_SCALE = (1.0 / (255.0 * np.asarray(STD, dtype=np.float32))).astype(np.float32)
_SHIFT = (np.asarray(MEAN, dtype=np.float32) / np.asarray(STD, dtype=np.float32)).astype(np.float32)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Copy the input tensor to ``device`` (a stage of its own so its cost is visible)."""

    device: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device)


@dataclass(frozen=True, slots=True)
class Forward:
    """Run ``model`` (already in eval mode, on the pipeline's device) without autograd."""

    model: Any

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        torch = _torch()
        with torch.inference_mode():
            return self.model(x)


def postprocess(logits: torch.Tensor) -> Predictions:
    """Softmax over classes and argmax, returned as numpy on the host."""
    torch = _torch()
    with torch.inference_mode():
        probs = torch.softmax(logits.float(), dim=1)
        ids = probs.argmax(dim=1)
        return Predictions(class_ids=ids.cpu().numpy(), probs=probs.cpu().numpy())


# ---------------------------------------------------------------- workload


def train_config(opts: WorkloadOptions) -> digits_cnn.TrainConfig:
    """The training configuration ``build(opts)`` uses (seed and input resolution from opts)."""
    return digits_cnn.TrainConfig(seed=opts.seed, res=VisionSpec.from_params(opts.params).res)


def load_model(opts: WorkloadOptions | None = None) -> digits_cnn.TrainedModel:
    """The trained float model for ``opts`` (from the weights cache, or trained now; CPU, eval mode)."""
    opts = opts or WorkloadOptions()
    spec = VisionSpec.from_params(opts.params)
    config = train_config(opts)
    data_key = {
        "dataset": "sklearn-digits",
        "data_version": DATA_VERSION,
        "size": spec.size,
        "quality": spec.quality,
        "seed": opts.seed,
        "noise": NOISE_HALF,
        "test_fraction": TEST_FRACTION,
        "mean": MEAN,
        "std": STD,
    }

    # the JPEGs (~2.5 s to render) only on a cache miss: a cached model needs neither its data nor its evaluation
    def train_data() -> tuple[torch.Tensor, torch.Tensor]:
        torch = _torch()
        train = digits_jpeg_splits(spec.size, opts.seed, spec.quality)[0]
        images = Preprocess(spec.res)(decode(train.jpegs))
        return images, torch.tensor(train.labels, dtype=torch.int64)

    def evaluate(model: torch.nn.Module) -> float:
        test = digits_jpeg_splits(spec.size, opts.seed, spec.quality)[1]
        return evaluate_accuracy(_assemble(model, spec, test, opts, "cpu"), test)

    return digits_cnn.load_or_train(config, data_key, train_data, evaluate)


def pipeline_for_model(model: Any, opts: WorkloadOptions | None = None) -> Pipeline:
    """A ``vision`` pipeline around any model mapping (N, 3, res, res) -> (N, 10) logits.

    For optimisers: wrap a quantised or compiled variant, then judge it with
    :func:`evaluate_accuracy`. The model is moved to ``opts.device`` and put in
    eval mode.
    """
    opts = opts or WorkloadOptions()
    spec = VisionSpec.from_params(opts.params)
    device = check_device(opts.device, "vision", "vision")
    test = digits_jpeg_splits(spec.size, opts.seed, spec.quality)[1]
    return _assemble(model, spec, test, opts, device)


def build(opts: WorkloadOptions) -> Pipeline:
    """The ``vision`` workload: the trained digits CNN served on the held-out JPEGs."""
    for module in ("torch", "PIL", "sklearn"):  # fail early with an install hint
        require(module, "vision")
    spec = VisionSpec.from_params(opts.params)
    device = check_device(opts.device, "vision", "vision")
    if opts.inputs_path is not None:
        raise LatencyLabError("vision: inputs_path is not supported (the workload serves its own test JPEGs)")
    test = digits_jpeg_splits(spec.size, opts.seed, spec.quality)[1]
    if opts.model_path is not None:
        model = digits_cnn.load_weights(opts.model_path)
        accuracy = evaluate_accuracy(_assemble(model, spec, test, opts, "cpu"), test)
        weights = opts.model_path
    else:
        trained = load_model(opts)
        model, accuracy, weights = trained.model, trained.test_accuracy, str(trained.path)
    pipe = _assemble(model, spec, test, opts, device)
    pipe.metadata.update({"test_accuracy": round(accuracy, 6), "weights": weights})
    return pipe


def evaluate_accuracy(pipeline: Pipeline, data: JpegSet | None = None, batch_size: int | None = None) -> float:
    """Top-1 accuracy of ``pipeline`` over every image of ``data`` (default: its test split).

    Runs the pipeline's real stages, in order, on batches of JPEG bytes; the
    last stage must return :class:`Predictions` or an (N, classes) array of
    scores. ``batch_size`` defaults to the pipeline's own (its metadata).
    """
    if data is None:
        meta = pipeline.metadata
        try:
            data = digits_jpeg_splits(int(meta["jpeg_size"]), int(meta["seed"]), int(meta["jpeg_quality"]))[1]
        except KeyError as exc:
            raise LatencyLabError(
                f"pipeline {pipeline.name!r} has no {exc.args[0]!r} in its metadata; pass the data"
            ) from None
    bs = int(batch_size or pipeline.metadata.get("batch_size", 1))
    if bs < 1:
        raise LatencyLabError(f"batch size must be >= 1, got {bs}")
    correct = 0
    for start in range(0, len(data), bs):
        x: Any = list(data.jpegs[start : start + bs])
        for stage in pipeline.stages:
            x = stage.fn(x)
        ids = _class_ids(x)
        want = np.asarray(data.labels[start : start + bs])
        if ids.shape != want.shape:
            raise LatencyLabError(f"pipeline returned {ids.shape[0]} predictions for {want.shape[0]} images")
        correct += int((ids == want).sum())
    return correct / len(data)


def _class_ids(out: Any) -> np.ndarray:
    if isinstance(out, Predictions):
        return np.asarray(out.class_ids).reshape(-1)
    if hasattr(out, "detach"):  # a torch tensor of scores
        out = out.detach().cpu().numpy()
    scores = np.asarray(out)
    if scores.ndim != 2:
        raise LatencyLabError(f"cannot read class predictions from output of shape {scores.shape}")
    return scores.argmax(axis=1)


def _assemble(model: Any, spec: VisionSpec, test: JpegSet, opts: WorkloadOptions, device: str) -> Pipeline:
    model = model.to(device).eval()
    bs = opts.batch_size

    def source(i: int) -> bytes | list[bytes]:
        jpegs, _ = test.batch(i, bs)
        return jpegs[0] if bs == 1 else jpegs

    pipe = Pipeline(
        "vision",
        source=source,
        device=device,
        metadata={
            "model": digits_cnn.MODEL_NAME,
            "params": digits_cnn.count_params(model),
            "input_resolution": spec.res,
            "jpeg_size": spec.size,
            "jpeg_quality": spec.quality,
            "mean_jpeg_bytes": round(test.mean_bytes, 1),
            "n_test_images": len(test),
            "batch_size": bs,
            "seed": opts.seed,
            "dataset": "sklearn digits, upscaled to JPEG",
        },
    )
    pipe.stage("decode", decode, kind="load")
    pipe.stage("preprocess", Preprocess(spec.res), kind="preprocess")
    if device != "cpu":
        pipe.stage("transfer", Transfer(device), kind="transfer")
    pipe.stage("forward", Forward(model), kind="forward")
    pipe.stage("postprocess", postprocess, kind="postprocess")
    return pipe


def _torch() -> Any:
    return require("torch", "vision")
