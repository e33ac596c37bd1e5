"""The vision workload's model: a small CNN, its reproducible training, and its weights cache.

The network is three conv blocks (conv 3x3 -> batch norm -> ReLU, max-pool
between blocks), a 2x2 average pool and one linear layer: about 26k
parameters at the default width, trained on one CPU thread in about ten
seconds, and still a real convolutional forward pass to time.

Training is deterministic for a given :class:`TrainConfig`: weights are
initialised from ``torch.manual_seed(seed)`` inside a forked RNG (the caller's
global RNG state is left alone), batches are shuffled by a seeded generator,
and training runs on one intra-op thread so that reduction order, and
therefore every bit of the result, does not depend on the machine's core
count. Trained weights are cached under :func:`cache_dir`, keyed by a hash of
everything that decides them (see :func:`cache_key`); a cache file that cannot
be read back is retrained and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latencylab.errors import LatencyLabError, require
from latencylab.threads import TorchThreads

if TYPE_CHECKING:
    import torch

MODEL_NAME = "digits-cnn"
# Bump whenever build_model or train_model changes what a given config produces:
# it is part of the cache key, so stale weights are never loaded.
MODEL_VERSION = 1
N_CLASSES = 10


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything that decides the trained weights (besides the training data).

    ``width`` is the channel count of the first conv block (doubled in each
    later block); ``res`` is the model's input side in pixels; ``threads`` is
    the intra-op thread count used while training (fixed so results are
    bitwise reproducible across machines).
    """

    seed: int = 0
    res: int = 64
    width: int = 16
    epochs: int = 8
    batch_size: int = 32
    lr: float = 4e-3
    weight_decay: float = 1e-4
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("res", "width", "epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise LatencyLabError(f"train config: {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise LatencyLabError(f"train config: lr must be > 0, got {self.lr}")


@dataclass(frozen=True, slots=True)
class TrainedModel:
    """A trained (or cache-loaded) model in eval mode, with where it came from."""

    model: Any  # torch.nn.Module; Any so that this module imports without torch
    config: TrainConfig
    path: Path
    test_accuracy: float
    train_seconds: float
    from_cache: bool


def build_model(width: int = 16, n_classes: int = N_CLASSES) -> torch.nn.Module:
    """The untrained network (parameters drawn from torch's global RNG).

    A stride-2 stem (as in ResNet) and two max-pools bring a 64x64 input to
    8x8 before the last block, so that its receptive field covers about half
    the digit; a 2x2 average pool keeps coarse layout (which half of the image
    a stroke is in) for the classifier. A plain ``nn.Sequential`` of
    conv / BN / ReLU triples, so quantisation tools can fuse them by index.
    """
    torch = _torch()
    nn = torch.nn
    w1, w2, w3 = width, 2 * width, 4 * width
    return nn.Sequential(
        nn.Conv2d(3, w1, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(w1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(w1, w2, 3, padding=1, bias=False),
        nn.BatchNorm2d(w2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(w2, w3, 3, padding=1, bias=False),
        nn.BatchNorm2d(w3),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * w3, n_classes),
    )


def count_params(model: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def train_model(
    config: TrainConfig,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    max_steps: int | None = None,
) -> torch.nn.Module:
    """Train a fresh network on ``images`` (N, 3, res, res) float32 and ``labels`` (N,) int64.

    AdamW with a one-cycle learning-rate schedule over ``config.epochs``
    epochs. ``max_steps`` stops early (the schedule is unchanged), which tests
    use to check reproducibility cheaply. Returns the model in eval mode.
    """
    torch = _torch()
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[0] != labels.shape[0]:
        raise LatencyLabError(
            f"train_model: want images (N, 3, H, W) and labels (N,), got {tuple(images.shape)} "
            f"and {tuple(labels.shape)}"
        )
    n = int(images.shape[0])
    steps_per_epoch = (n + config.batch_size - 1) // config.batch_size
    total_steps = config.epochs * steps_per_epoch
    # fork_rng: seeding here must not change the caller's global RNG stream.
    with TorchThreads(config.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = build_model(config.width)
        gen = torch.Generator().manual_seed(config.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=total_steps)
        loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        step = 0
        for _ in range(config.epochs):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, config.batch_size):
                if max_steps is not None and step >= max_steps:
                    break
                idx = order[start : start + config.batch_size]
                loss = loss_fn(model(images[idx]), labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                step += 1
    return model.eval()


def cache_dir() -> Path:
    """``$LATENCYLAB_CACHE`` if set, else ``~/.cache/latencylab``."""
    env = os.environ.get("LATENCYLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "latencylab"


def cache_key(config: TrainConfig, data_key: Mapping[str, Any]) -> str:
    """A short stable hash of the model version, the train config and the data's identity."""
    payload = {
        "model": MODEL_NAME,
        "version": MODEL_VERSION,
        "config": asdict(config),
        "data": dict(data_key),
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(config: TrainConfig, data_key: Mapping[str, Any]) -> Path:
    return cache_dir() / "vision" / f"{MODEL_NAME}-{cache_key(config, data_key)}.pt"


def load_or_train(
    config: TrainConfig,
    data_key: Mapping[str, Any],
    train_data: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    evaluate: Callable[[torch.nn.Module], float],
) -> TrainedModel:
    """Load cached weights for (config, data) or train, evaluate and cache them.

    ``data_key`` identifies the training data (it goes into the cache key);
    ``train_data()`` is called only on a cache miss and returns (images,
    labels); ``evaluate(model)`` returns the held-out accuracy, which is stored
    with the weights so that a cache hit does not re-measure it.
    """
    path = cache_path(config, data_key)
    loaded = _load_cached(path, config)
    if loaded is not None:
        model, accuracy, seconds = loaded
        return TrainedModel(model, config, path, accuracy, seconds, from_cache=True)

    images, labels = train_data()
    t0 = time.perf_counter()
    model = train_model(config, images, labels)
    seconds = time.perf_counter() - t0
    accuracy = float(evaluate(model))
    _save(path, model, accuracy, seconds)
    return TrainedModel(model, config, path, accuracy, seconds, from_cache=False)


def load_weights(path: str | Path, width: int = 16) -> torch.nn.Module:
    """Load a state_dict (or a cache record holding one) saved with ``torch.save``; eval mode."""
    torch = _torch()
    try:
        obj = torch.load(Path(path), map_location="cpu", weights_only=True)
        state = obj["state_dict"] if isinstance(obj, dict) and "state_dict" in obj else obj
        model = build_model(width)
        model.load_state_dict(state)
    except FileNotFoundError as exc:
        raise LatencyLabError(f"model weights not found: {path}") from exc
    except Exception as exc:  # torch.load / load_state_dict fail in many ways; all mean "not our weights"
        raise LatencyLabError(f"cannot load digits-cnn weights from {path}: {_one_line(exc)}") from exc
    return model.eval()


def _load_cached(path: Path, config: TrainConfig) -> tuple[torch.nn.Module, float, float] | None:
    if not path.is_file():
        return None
    torch = _torch()
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model(config.width)
        model.load_state_dict(record["state_dict"])
        accuracy = float(record["test_accuracy"])
        seconds = float(record["train_seconds"])
    # A truncated or foreign file raises anything from UnpicklingError to
    # RuntimeError (zip reader) to KeyError; every one of them means "retrain".
    except Exception as exc:
        warnings.warn(
            f"vision: cached weights {path} are unreadable ({_one_line(exc)}); retraining",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return model.eval(), accuracy, seconds


def _save(path: Path, model: torch.nn.Module, accuracy: float, seconds: float) -> None:
    torch = _torch()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"state_dict": model.state_dict(), "test_accuracy": accuracy, "train_seconds": seconds}
    # Write then rename, so a concurrent reader never sees half a file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(record, tmp)
    os.replace(tmp, path)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _torch() -> Any:
    return require("torch", "vision")
