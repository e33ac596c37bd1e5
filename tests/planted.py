"""Pipelines with one planted problem each, as a user would write them (no probe, no hints to latencylab).

Used by tests/test_diagnose_pipelines.py, through the Python API and through ``--pipeline planted:make_X``.
The sizes and periods are this file's own; the effects are large enough to be unmistakable on a busy machine.
Baseline work that must not drift with the machine's load spins to a wall-clock deadline (``_spin``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from latencylab.pipeline import Pipeline

PAUSE_EVERY, PAUSE_PHASE, PAUSE_MS, PAUSE_BASE_MS = 29, 11, 9.0, 3.0  # x4 the baseline: under the old 10x rule
RECOMPILE_EVERY, RECOMPILE_LENGTHS = 70, (12, 20, 28, 36, 44, 52)
CYCLE = 24
PAD_BATCH, PAD_MIN, PAD_MAX = 6, 3, 200


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


# ------------------------------------------------------------------ 1. a pure-Python data path
def python_normalise(img: np.ndarray) -> list[float]:
    """Per-pixel normalisation in interpreted Python (the planted slow function)."""
    out = []
    for v in img.reshape(-1).tolist():
        out.append((v / 255.0 - 0.45) / 0.225)
    return out


def make_data_path() -> Pipeline:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in range(8)]
    w = rng.standard_normal((40 * 40 * 3, 32)).astype(np.float32)
    pipe = Pipeline("planted-data-path", source=lambda i: images[i % len(images)])
    pipe.stage("normalise", python_normalise, kind="preprocess")
    pipe.stage("forward", lambda x: np.asarray(x, dtype=np.float32) @ w, kind="forward")
    pipe.stage("postprocess", lambda y: int(np.argmax(y)), kind="postprocess")
    return pipe


# ------------------------------------------------------------------ 2. a pause every PAUSE_EVERY forwards
def make_pauses() -> Pipeline:
    def forward(item: tuple[int, np.ndarray]) -> np.ndarray:
        i, x = item
        _spin(PAUSE_BASE_MS)
        if i % PAUSE_EVERY == PAUSE_PHASE:
            time.sleep(PAUSE_MS / 1e3)  # e.g. a flush every 29 calls
        return x * 2.0

    x = np.ones(16, dtype=np.float32)
    pipe = Pipeline("planted-pauses", source=lambda i: (i, x))
    pipe.stage("prepare", lambda item: item, kind="preprocess")
    pipe.stage("forward", forward, kind="forward")
    return pipe


# ------------------------------------------------------------------ 3. torch.compile recompiling on new shapes
def recompile_length(i: int) -> int:
    return RECOMPILE_LENGTHS[(i // RECOMPILE_EVERY) % len(RECOMPILE_LENGTHS)]


def make_recompiles() -> Pipeline:
    import torch

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.ReLU(), torch.nn.Linear(48, 4)).eval()
    compiled = torch.compile(model, dynamic=False, backend="eager")
    inputs = {n: torch.randn(2, n, 24) for n in RECOMPILE_LENGTHS}

    def forward(x: Any) -> Any:
        with torch.inference_mode():
            return compiled(x)

    pipe = Pipeline("planted-recompiles", source=lambda i: inputs[recompile_length(i)])
    pipe.stage("forward", forward, kind="forward")
    pipe.stage("postprocess", lambda y: y.argmax(dim=-1).numpy(), kind="postprocess")
    return pipe


# ------------------------------------------------------------------ 4. variable lengths padded to the longest
WORDS = [f"w{k}" for k in range(500)]


def pad_lengths(i: int) -> list[int]:
    return [int(v) for v in np.random.default_rng(i).integers(PAD_MIN, PAD_MAX + 1, PAD_BATCH)]


def make_padding() -> Pipeline:
    rng = np.random.default_rng(5)
    emb = rng.standard_normal((len(WORDS), 48)).astype(np.float32)
    w = rng.standard_normal((48, 48)).astype(np.float32)
    vocab = {t: k for k, t in enumerate(WORDS)}

    def source(i: int) -> list[str]:
        r = np.random.default_rng(10_000 + i)
        return [" ".join(WORDS[k] for k in r.integers(0, len(WORDS), n)) for n in pad_lengths(i)]

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        ids = [[vocab[t] for t in s.split()] for s in texts]
        longest = max(len(v) for v in ids)
        out = np.zeros((len(ids), longest), dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for k, v in enumerate(ids):
            out[k, : len(v)] = v
            mask[k, : len(v)] = 1
        return {"input_ids": out, "attention_mask": mask}

    def forward(enc: dict[str, np.ndarray]) -> np.ndarray:
        h = emb[enc["input_ids"]]  # (batch, padded, 48): every padded position costs as much as a real one
        for _ in range(2):
            h = np.tanh(h @ w)
        m = enc["attention_mask"][..., None]
        return np.asarray((h * m).sum(axis=1) / m.sum(axis=1))

    pipe = Pipeline("planted-padding", source=source)
    pipe.stage("tokenize", tokenize, kind="preprocess")
    pipe.stage("forward", forward, kind="forward")
    return pipe


# ------------------------------------------------------------------ 5. threads set on the first forward call
def threads_planted(cpus: int) -> int:
    return 3 * cpus


def make_threads() -> Pipeline:
    import os

    import torch

    cpus = len(os.sched_getaffinity(0))
    model = torch.nn.Sequential(torch.nn.Linear(384, 384), torch.nn.GELU(), torch.nn.Linear(384, 384)).eval()
    x = torch.randn(48, 384)
    state = {"first": True}

    def forward(t: Any) -> Any:
        if state["first"]:  # "tuning" done lazily, after the environment was recorded
            torch.set_num_threads(threads_planted(cpus))
            state["first"] = False
        with torch.inference_mode():
            return model(t)

    pipe = Pipeline("planted-threads", source=lambda i: x)
    pipe.stage("forward", forward, kind="forward")
    return pipe


# ------------------------------------------------------------------ 6. a clean control
def make_control() -> Pipeline:
    x = np.ones(32, dtype=np.float32)

    def forward(v: np.ndarray) -> np.ndarray:
        _spin(1.5)
        return v + 1.0

    pipe = Pipeline("planted-control", source=lambda i: x)
    pipe.stage("prepare", lambda v: v * 0.5, kind="preprocess")
    pipe.stage("forward", forward, kind="forward")
    return pipe


# ------------------------------------------------------------------ 7. a fixed input set, cycled
def cycle_cost_ms(k: int) -> float:
    return 0.3 + 2.4 * ((k * 7) % CYCLE) / (CYCLE - 1)  # 0.3-2.7 ms, scrambled order


def make_cycle() -> Pipeline:
    inputs = [f"request-{k}" for k in range(CYCLE)]
    cost = {s: cycle_cost_ms(k) for k, s in enumerate(inputs)}
    pipe = Pipeline("planted-cycle", source=lambda i: inputs[i % CYCLE])
    pipe.stage("forward", lambda s: _spin(cost[s]) or s, kind="forward")
    return pipe


# ------------------------------------------------------------------ 8. a user pipeline named like a built-in
def make_vision() -> Pipeline:
    x = np.ones(64, dtype=np.float32)
    pipe = Pipeline("vision", source=lambda i: x)
    pipe.stage("load_img", lambda v: v.copy(), kind="load")
    pipe.stage("classify", lambda v: _spin(0.5) or float(v.sum()), kind="forward")
    return pipe
