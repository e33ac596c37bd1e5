"""Variants with known, adjustable cost for server tests (Y = scale * X; forward sleeps ``delay_s``).

Given a ``FakeClock``, a variant spends its costs by advancing that clock instead of sleeping: a server built
on the same clock then measures exactly ``delay_s`` per batch, however busy the machine is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab.clock import FakeClock
from latencylab.serve.types import InferRequest, ProtocolError, Tensor, TensorSpec


class FakeVariant:
    kind = "primary"
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 4)),)

    def __init__(
        self,
        name: str,
        delay_s: float = 0.002,
        scale: float = 2.0,
        max_batch_size: int = 8,
        pre_delay_s: float = 0.0,
        clock: FakeClock | None = None,
    ) -> None:
        self.name = name
        self.clock = clock  # spend costs on this clock instead of sleeping
        self.delay_s = delay_s
        self.pre_delay_s = pre_delay_s  # preprocess sleeps this long (like a JPEG decode)
        self.scale = scale
        self.max_batch_size = max_batch_size
        self.fail = False
        self.hang = threading.Event()  # set -> forward blocks until cleared... (see forward)
        self.batch_sizes: list[int] = []

    def preprocess(self, request: InferRequest) -> Any:
        if self.pre_delay_s:
            self._spend(self.pre_delay_s)
        x = request.input("X").data
        if x.shape[0] < 1:
            raise ProtocolError("input 'X': need at least one row")
        return np.asarray(x, dtype=np.float32)

    def forward(self, items: Sequence[Any]) -> Any:
        self.batch_sizes.append(len(items))
        if self.fail:
            raise RuntimeError("injected failure")
        if self.hang.is_set():
            time.sleep(5.0)  # real time, whatever the clock: a hung thread
        self._spend(self.delay_s)
        return [x * self.scale for x in items]

    def postprocess(self, raw: Any, n: int) -> list[tuple[Tensor, ...]]:
        return [(Tensor("Y", "FP32", tuple(y.shape), y),) for y in raw]

    def warmup_items(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            if self.pre_delay_s:
                self._spend(self.pre_delay_s)
            out.append(np.ones((1, 4), dtype=np.float32))
        return out

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for _n in batch_sizes:
            for _ in range(2):
                self._spend(self.delay_s)

    def _spend(self, seconds: float) -> None:
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.advance(seconds * 1e9)


def make(names: Sequence[str], max_batch_size: int, device: str) -> list[FakeVariant]:
    """Factory for configs: FAKE_DELAY_MS_<NAME> sets a variant's forward time (default 2 ms)."""
    return [
        FakeVariant(n, float(os.environ.get(f"FAKE_DELAY_MS_{n.upper()}", "2")) / 1e3, max_batch_size=max_batch_size)
        for n in names
    ]


class BucketedFakeVariant(FakeVariant):
    """A fake variant with cost buckets, like text's padded lengths: an item's bucket is the smallest of
    ``buckets`` holding its "tokens" (the first value of its X), and a batch of n items of bucket b costs
    ``per_item_s[b] * n`` (spent on the clock)."""

    buckets = (16, 256)

    def __init__(self, name: str, per_item_s: dict[int, float], clock: FakeClock | None = None, **kw: Any) -> None:
        super().__init__(name, 0.0, clock=clock, **kw)
        self.per_item_s = dict(per_item_s)

    def bucket(self, item: Any) -> int:
        tokens = float(np.asarray(item).flat[0])
        return next((b for b in self.buckets if tokens <= b), self.buckets[-1])

    def forward(self, items: Sequence[Any]) -> Any:
        self.batch_sizes.append(len(items))
        self._spend(self.per_item_s[self.bucket(items[0])] * len(items))
        return [x * self.scale for x in items]

    def warmup_items(self, n: int, bucket: int | None = None) -> list[Any]:
        tokens = self.buckets[0] * 3 // 4 if bucket is None else bucket * 3 // 4
        return [np.full((1, 4), tokens, dtype=np.float32) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        pass


class SometimesSlow(FakeVariant):
    """Every 4th batch takes 15 ms more than the others: the latency model's mean cannot predict which."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, 0.002, clock=clock)
        self.calls = 0

    def forward(self, items: Sequence[Any]) -> Any:
        self.calls += 1
        if self.calls % 4 == 0:
            self._spend(0.015)
        return super().forward(items)


def admission_state(clock: FakeClock) -> Any:
    """A server state for admission tests: one fake model, 30-ms SLO and default deadline, 50-ms variant, no slack."""
    from latencylab.serve.app import build_state
    from latencylab.serve.config import ModelConfig, ServerConfig

    model = ModelConfig(
        name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=30, default_deadline_ms=30,
        admission_slack="off",
    )  # fmt: skip
    return build_state(ServerConfig(models=(model,)), {"fake": [FakeVariant("fp32", 0.05, clock=clock)]}, clock=clock)
