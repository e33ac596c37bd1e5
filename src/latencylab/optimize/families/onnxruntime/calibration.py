"""Calibration: the feeds static quantisation reads, its tensors, and the ranges (MinMax, Entropy, Percentile, EMA
3-sigma)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.families.onnxruntime.common import (
    STATIC_OPS,
    _feeds_digest,
    _file_digest,
    _key,
    _onnx,
    _ort,
    _quiet,
    _workdir,
)
from latencylab.optimize.types import BuildContext, Feed


class FeedReader:
    """A ``CalibrationDataReader`` over a list of feeds; ``served`` counts the feeds handed out."""

    def __init__(self, feeds: Sequence[Feed], input_names: Sequence[str] | None = None) -> None:
        self.feeds = list(feeds)
        self.input_names = tuple(input_names) if input_names is not None else None
        self.served = 0
        self._start, self._end, self._i = 0, len(self.feeds), 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._i >= self._end:
            return None
        feed = self.feeds[self._i]
        self._i += 1
        self.served += 1
        return dict(feed) if self.input_names is None else {n: feed[n] for n in self.input_names}

    def __iter__(self) -> FeedReader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item

    def __len__(self) -> int:
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._start, self._end, self._i = start_index, min(end_index, len(self.feeds)), start_index

    def rewind(self) -> None:
        self._start, self._end, self._i = 0, len(self.feeds), 0


def _model_inputs(path: Path) -> list[str]:
    onnx = _onnx()
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _calibration_feeds(ctx: BuildContext, n: int | None) -> list[Feed]:
    feeds = list(ctx.adapter.calibration())
    if not feeds:
        raise LatencyLabError(f"adapter {ctx.adapter.name!r} has no calibration feeds")
    return feeds[:n] if n else feeds


def _tensors_to_calibrate(model: Any, op_types: Sequence[str]) -> list[Any]:
    """Value infos of the float activations around ``op_types`` nodes (what ORT's calibrators would pick)."""
    onnx = _onnx()
    vis = {vi.name: vi for vi in model.graph.value_info}
    vis.update({o.name: o for o in model.graph.output})
    vis.update({i.name: i for i in model.graph.input})
    inits = {i.name for i in model.graph.initializer}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    out: dict[str, Any] = {}
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        for name in [*node.input, *node.output]:
            vi = vis.get(name)
            if vi is None or name in inits or not vi.type.HasField("tensor_type"):
                continue
            if vi.type.tensor_type.elem_type in floats:
                out[name] = vi
    return list(out.values())


def ema_sigma_ranges(
    model_path: Path, reader: FeedReader, op_types: Sequence[str], ema_constant: float = 0.1, sigmas: float = 3.0
) -> dict[str, tuple[float, float]]:
    """Per-tensor ranges: EMA-smoothed batch min/max, clipped to mean +- ``sigmas`` * std.

    Each calibration batch gives every tensor a min and a max; these are smoothed as
    ``m <- (1 - c) * m + c * batch_value`` (first batch initialises), so one outlier batch cannot stretch the
    range as plain MinMax lets it. The mean and std are pooled over every element of every batch (float64
    sums); the final range is ``[max(ema_min, mean - k*std), min(ema_max, mean + k*std)]``. Clipping spends the
    256 levels on where the values are, so small features are no longer rounded away (the seeds' CT-lesion
    case), at the price of saturating the rare values outside k sigma.
    """
    ort = _ort()
    onnx = _onnx()
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(model_path))
    targets = _tensors_to_calibrate(model, op_types)
    if not targets:
        raise LatencyLabError(f"no float activations around {list(op_types)} in {Path(model_path).name}")
    existing = {o.name for o in model.graph.output}
    for vi in targets:
        if vi.name not in existing:
            model.graph.output.append(vi)
    names = [vi.name for vi in targets]
    with tempfile.TemporaryDirectory(prefix="latencylab-ema-") as tmp:
        aug = Path(tmp) / "augmented.onnx"
        onnx.save(model, str(aug))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor as it is
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(aug), sess_options=so, providers=["CPUExecutionProvider"])
        lo: dict[str, float] = {}
        hi: dict[str, float] = {}
        acc = {n: [0.0, 0.0, 0] for n in names}  # sum, sum of squares, count
        for feed in reader:
            outs = sess.run(names, feed)
            for n, a in zip(names, outs, strict=True):
                a64 = np.asarray(a, dtype=np.float64)
                if a64.size == 0:
                    continue
                bmin, bmax = float(a64.min()), float(a64.max())
                lo[n] = bmin if n not in lo else (1 - ema_constant) * lo[n] + ema_constant * bmin
                hi[n] = bmax if n not in hi else (1 - ema_constant) * hi[n] + ema_constant * bmax
                s = acc[n]
                s[0] += float(a64.sum())
                s[1] += float(np.square(a64).sum())
                s[2] += int(a64.size)
    if not lo:
        raise LatencyLabError("EMA calibration saw no data (no calibration feeds?)")
    ranges: dict[str, tuple[float, float]] = {}
    for n in lo:
        total, sq, count = acc[n]
        mean = total / count
        std = float(np.sqrt(max(sq / count - mean * mean, 0.0)))
        rmin = max(lo[n], mean - sigmas * std)
        rmax = min(hi[n], mean + sigmas * std)
        if not np.isfinite(rmin) or not np.isfinite(rmax) or rmin > rmax:
            rmin, rmax = lo[n], hi[n]
        ranges[n] = (rmin, rmax)
    return ranges


def _calibration_table(ctx: BuildContext, src: Path, q: Mapping[str, Any], reader: FeedReader) -> Path:
    """The tensor ranges for a static recipe, as ORT's calibration-cache JSON (computed once per source/method)."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data

    method = q["calibration"]
    op_types = list(q.get("op_types") or STATIC_OPS)
    calib_cfg = {k: q.get(k) for k in ("calibration", "percentile", "num_bins", "ema_constant", "sigmas", "op_types")}
    key = _key("calib", _file_digest(ctx, src), _feeds_digest(reader.feeds), calib_cfg, _ort().__version__)
    dst = _workdir(ctx) / f"calib-{key}.json"
    if dst.exists():
        return dst
    reader.rewind()
    if method == "ema-3sigma":
        ranges = ema_sigma_ranges(src, reader, op_types, float(q.get("ema_constant", 0.1)), float(q.get("sigmas", 3.0)))
        data = TensorsData(
            CalibrationMethod.MinMax,
            {n: (np.array(a, dtype=np.float32), np.array(b, dtype=np.float32)) for n, (a, b) in ranges.items()},
        )
    else:
        enum = _calibration_method(method)
        extra: dict[str, Any] = {}
        if method == "percentile":
            extra["percentile"] = float(q.get("percentile", 99.99))
        if method in ("entropy", "percentile") and q.get("num_bins"):
            extra["num_bins"] = int(q["num_bins"])
        with tempfile.TemporaryDirectory(prefix="latencylab-calib-") as tmp, _quiet():
            calibrator = create_calibrator(
                src,
                op_types,
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=enum,
                extra_options=extra,
            )
            calibrator.collect_data(reader)
            data = calibrator.compute_data()
            del calibrator
    save_tensors_data(data, dst)
    return dst


def _calibration_method(name: str) -> Any:
    from onnxruntime.quantization import CalibrationMethod

    table = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
        "ema-3sigma": CalibrationMethod.MinMax,  # our ranges are stored as a MinMax table
    }
    if name not in table:
        raise LatencyLabError(f"unknown calibration method {name!r}; one of {sorted(table)}")
    return table[name]
