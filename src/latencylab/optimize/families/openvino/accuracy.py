"""NNCF's accuracy-control loop driven by latencylab's own fidelity budget (``ov-int8-ac``, ``ov-int8-transformer-ac``).

``nncf.quantize_with_accuracy_control`` quantises the model fully, measures a metric on a validation set, and
while the metric has dropped by more than ``max_drop`` it ranks the quantised operations by how much each costs
and reverts the worst to float, one group at a time. Here the metric is the budget itself, as one number:

    score = min over the budget's terms of that term's remaining slack, as a fraction of the FP32 model's

(``cos>=b``: ``(cos - b) / (1 - b)``; ``min_cos`` and ``top1`` the same; ``accuracy_drop<=b``: ``(b - drop) / b``;
``max_abs<=b``: ``(b - max_abs) / b``). The FP32 model scores 1 and a model exactly on the budget's edge 0, so
``max_drop=1`` (absolute) asks NNCF for "inside the budget", with every term judged as the search judges it.
The per-item values NNCF ranks with are the row's cosine to the FP32 output (embeddings) or whether its top-1
is right (classifiers: against the label where there is one, else the FP32 model's top-1).

**Validation data:** held-out feeds only, never the calibration ones: every other feed of each held-out set
(``feeds[0::2]``; with task labels, of the labelled primary set), so the search's own fidelity, measured on
every held-out feed, judges half of them on inputs the loop never saw. The reference is the FP32 export's
output on them (OpenVINO FP32, what the loop reverts towards).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.optimize.families.openvino.common import _nncf, _quiet, compile_model, core
from latencylab.optimize.search import Budget, fidelity
from latencylab.optimize.types import BuildContext, Feed

# Each reverted group costs a validation pass and the ranking costs one per quantised group: the loop stops after
# this many reverts (the search then judges whatever it returned, inside the budget or not).
MAX_REVERTS = 24
# The ranking runs on at most this many validation items (those whose value changed most).
RANKING_ITEMS = 32
_SIDE = ".ac.json"

Item = tuple[Feed, np.ndarray, np.ndarray | None]  # feed, FP32 output rows, labels of those rows (or None)


def slack(metric: str, op: str, bound: float, value: float) -> float:
    """How much of the room between ``bound`` and the FP32 model's value of ``metric`` is left (1 = all of it,
    0 = on the edge, below 0 = outside)."""
    ideal = 0.0 if op == "<=" else 1.0
    room = abs(ideal - bound)
    if room == 0.0:
        return 1.0 if (value <= bound if op == "<=" else value >= bound) else -1.0
    return (bound - value) / room if op == "<=" else (value - bound) / room


def score(budget: Budget, reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None) -> float:
    """The budget as one number (module docstring): ``min`` over its terms of :func:`slack`."""
    f = fidelity(reference, outputs, labels)
    vals = []
    for metric, op, bound in budget.terms:
        v = f.value(metric)
        vals.append(-1.0 if v is None else slack(metric, op, bound, v))
    return float(min(vals))


def _per_item(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None, kind: str) -> list[float]:
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    out = outputs.reshape(len(outputs), -1).astype(np.float64)
    if kind == "logits":
        truth = labels if labels is not None else ref.argmax(1)
        return [float(x) for x in out.argmax(1) == truth]
    norms = np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1), 1e-30)
    return [float(x) for x in (ref * out).sum(1) / norms]


def validation_items(ctx: BuildContext, budget: Budget) -> list[Item]:
    """Every other held-out feed (with task labels: of the labelled primary set) with its FP32 output rows."""
    needs_labels = any(t[0] == "accuracy_drop" for t in budget.terms)
    labels = ctx.adapter.labels() if needs_labels else None
    picked: list[tuple[Feed, np.ndarray | None]]
    if labels is not None:
        feeds = ctx.adapter.heldout()
        rows = np.cumsum([0, *(len(next(iter(f.values()))) for f in feeds)])
        picked = [(f, labels[rows[i] : rows[i + 1]]) for i, f in enumerate(feeds) if i % 2 == 0]
    else:
        picked = [(f, None) for feeds in ctx.input_sets().values() for f in feeds[0::2]]
    fp32 = compile_model(core().read_model(str(ctx.fp32_onnx())), ctx.threads)
    names = [i.get_any_name() for i in fp32.inputs]
    return [(f, np.asarray(fp32({n: f[n] for n in names})[0], np.float32), lab) for f, lab in picked]


def _validation_fn(budget: Budget, kind: str) -> Any:
    def validate(compiled: Any, items: Iterable[Item]) -> tuple[float, list[float]]:
        names = [i.get_any_name() for i in compiled.inputs]
        refs: list[np.ndarray] = []
        outs: list[np.ndarray] = []
        labs: list[np.ndarray | None] = []
        per: list[float] = []
        for feed, ref, lab in items:
            out = np.asarray(compiled({n: feed[n] for n in names})[0], np.float32)
            refs.append(ref)
            outs.append(out)
            labs.append(lab)
            per += _per_item(ref, out, lab, kind)
        labels = None if any(x is None for x in labs) else np.concatenate([x for x in labs if x is not None])
        return score(budget, np.concatenate(refs), np.concatenate(outs), labels), per

    return validate


def quantize(
    ctx: BuildContext, model: Any, calibration: Sequence[Feed], q: Mapping[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """``model`` quantised by NNCF's accuracy-control loop within ``q["budget"]``; the loop's figures beside it."""
    nncf = _nncf()
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    budget = Budget.parse(str(q["budget"]))
    items = validation_items(ctx, budget)
    names = [i.get_any_name() for i in model.inputs]
    kw: dict[str, Any] = {}
    if q.get("model_type") == "transformer":
        kw["model_type"] = nncf.ModelType.TRANSFORMER
    validate = _validation_fn(budget, ctx.adapter.output_kind)
    # The score of every call over all the items: the FP32 model's, the fully quantised model's, ..., the result's.
    full_passes: list[float] = []
    calls: list[int] = []

    def counted(compiled: Any, data: Iterable[Item]) -> tuple[float, list[float]]:
        got = validate(compiled, list(data))
        calls.append(len(got[1]))
        if len(got[1]) == rows:
            full_passes.append(got[0])
        return got

    rows = sum(len(_per_item(ref, ref, lab, ctx.adapter.output_kind)) for _, ref, lab in items)
    with _quiet():
        out = nncf.quantize_with_accuracy_control(
            model,
            nncf.Dataset([{n: f[n] for n in names} for f in calibration]),
            nncf.Dataset(items),
            counted,
            max_drop=1.0,
            drop_type=nncf.DropType.ABSOLUTE,
            subset_size=len(calibration),
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                max_num_iterations=int(q.get("max_reverts", MAX_REVERTS)), ranking_subset_size=RANKING_ITEMS
            ),
            **kw,
        )
    stats = {
        "budget": budget.text,
        "validation_feeds": len(items),
        "score_fully_quantised": round(full_passes[1], 6) if len(full_passes) > 1 else None,
        "score": round(full_passes[-1], 6) if full_passes else None,
        "validation_calls": len(calls),
        "fake_quantizers": fake_quantizers(out),
    }
    return out, stats


def fake_quantizers(model: Any) -> int:
    """How many FakeQuantize operations (quantised tensors) ``model`` has."""
    return sum(1 for op in model.get_ops() if op.get_type_name() == "FakeQuantize")


def save_stats(xml: Path, stats: Mapping[str, Any]) -> None:
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.with_suffix(_SIDE).write_text(json.dumps(dict(stats)))


def load_stats(xml: Path) -> dict[str, Any]:
    side = xml.with_suffix(_SIDE)
    return dict(json.loads(side.read_text())) if side.is_file() else {}
