"""Length-routed candidates: one runtime for short inputs, another for long ones (``--families ...,openvino``).

On this AVX2 machine (docs/benchmarks/optimize.md, issue 21) OpenVINO's transformer INT8 runs a 128-token
passage about 1.26x faster than ONNX Runtime's per-channel dynamic INT8, and a natural-length sentence about
0.6x as fast: its per-call cost (shape inference, buffer reallocation with dynamic shapes) outweighs its better
kernels until the matrices are large. Neither is the faster variant on a mix of lengths; a router is. A
``route-*`` candidate runs every input whose sequence has fewer than ``at`` positions (the mask's width: what the
runtime computes) on its **short** member and the rest on its **long** member; both members are the families'
own candidates, rebuilt from their params (the recipe), so their files are the ones the search already made.

``at`` is a number of positions, or ``"auto"``: measured when the candidate is built, on this machine, from the
calibration feeds only (never a held-out one). Each member runs the widest calibration feed cut to each length
of :data:`LENGTHS` below its width and to its width (the text workload's: 128), interleaved (warm-up, then
:data:`CALLS` calls each, alternating); ``at`` is the shortest length from which the long member's median is the
lower at every longer length. Where there is none, the build reports the candidate **skipped**
(``NotApplicable``): the router would be its short member, a duplicate the search would time twice. The medians
and the ``at`` found are in ``stats["route"]``; the search then measures the router as it measures every
candidate, in the same interleaved rounds, and its fidelity on every held-out feed. An equal-work variant: every
input is computed whole, by one member or the other; nothing is padded, cut or skipped.

The chosen router is exported as ``route.json`` beside the short member's ``model.onnx`` and the long member's
``model.xml`` + ``model.bin``; ``serve --from`` serves it (:class:`latencylab.serve.routed.RoutedTextVariant`)
with the same ``at`` on each batch's padded width.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError, MissingDependencyError, NotApplicable
from latencylab.optimize import shapes
from latencylab.optimize.types import BuildContext, Candidate, Feed, Runner
from latencylab.timing import now_ns

BACKEND = "routed"
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CALLS = 7
ROUTE_FILE = "route.json"

# (name, short member, long member): the ORT INT8 recipes the search has chosen on this machine, and
# OpenVINO's transformer INT8, the faster kernel library on long inputs here
ROUTES = (
    ("route-ort-ov-int8", "ort-int8-dynamic-fused-perchannel", "ov-int8-transformer"),
    ("route-ort-ov-int8-fallback-k2", "ort-int8-dynamic-perchannel-fallback-k2", "ov-int8-transformer"),
)


def width(feed: Mapping[str, np.ndarray]) -> int | None:
    """The sequence positions a feed runs (its mask's width), or None for a feed without a (rows, seq) mask."""
    mask = feed.get(shapes.MASK)
    return int(np.shape(mask)[1]) if mask is not None and np.ndim(mask) == 2 else None


def cut_to(feed: Feed, length: int) -> Feed:
    """``feed`` with every (rows, seq) input cut to its first ``length`` positions (a timing input of that
    width: which tokens fill it does not change the work)."""
    seq = width(feed)
    return {n: np.ascontiguousarray(a[:, :length]) if seq is not None and np.ndim(a) == 2 and a.shape[1] == seq
            else a for n, a in feed.items()}  # fmt: skip


def crossover(medians: Mapping[int, tuple[float, float]]) -> int | None:
    """The shortest length from which the long member (second of each pair) is faster at every longer length."""
    at: int | None = None
    for length in sorted(medians, reverse=True):
        short_ms, long_ms = medians[length]
        if long_ms >= short_ms:
            break
        at = length
    return at


def measure_crossover(short: Runner, long: Runner, feeds: Sequence[Feed], clock: Clock | None = None) -> dict[str, Any]:
    """Time both members on the longest of ``feeds`` cut to each length (module docstring); the medians (ms)
    and the ``at`` they give."""
    clk = clock or PerfCounterClock()
    longest = max(feeds, key=lambda f: width(f) or 0)
    top = width(longest) or 0
    medians: dict[int, tuple[float, float]] = {}
    for length in sorted({*(n for n in LENGTHS if n < top), top}):
        feed = cut_to(longest, length)
        for r in (short, long, short, long):  # warm-up: first calls at a new shape allocate
            r.run(feed)
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(CALLS):
            for i, r in enumerate((short, long)):
                t0 = now_ns(clk)
                r.run(feed)
                times[i].append((now_ns(clk) - t0) / 1e6)
        medians[length] = (statistics.median(times[0]), statistics.median(times[1]))
    table = {str(k): [round(a, 4), round(b, 4)] for k, (a, b) in medians.items()}
    return {"at": crossover(medians), "medians_ms": table}


class RoutedRunner:
    """Runs a feed on ``short`` when its width is below ``at`` (or ``at`` is None), else on ``long``."""

    def __init__(self, short: Runner, long: Runner, at: int | None, stats: dict[str, Any]) -> None:
        self.short, self.long, self.at = short, long, at
        self.tokens = shapes.TokenCounter()
        self.routed = [0, 0]
        self.stats = stats

    def member(self, feed: Mapping[str, np.ndarray]) -> Runner:
        w = width(feed)
        return self.long if self.at is not None and w is not None and w >= self.at else self.short

    def run(self, feed: Feed) -> np.ndarray:
        self.tokens.count(feed)
        r = self.member(feed)
        self.routed[r is self.long] += 1
        return r.run(feed)

    def export_artifact(self, out_dir: Path) -> Path:
        """``route.json`` + the short member's ``model.onnx`` + the long member's ``model.xml``/``.bin``."""
        out_dir = Path(out_dir)
        src = getattr(self.short, "model_path", None)
        save = getattr(self.long, "export_artifact", None)
        if src is None or not callable(save):
            raise LatencyLabError("a routed variant exports an ONNX short member and an OpenVINO long member only")
        shutil.copyfile(src, out_dir / "model.onnx")
        long_path = Path(save(out_dir))
        doc = {"kind": "route", "at": self.at, "short": "model.onnx", "long": long_path.name,
               "measured": self.stats.get("route", {})}  # fmt: skip
        dst = out_dir / ROUTE_FILE
        dst.write_text(json.dumps(doc, indent=2))
        return dst

    def close(self) -> None:
        self.short.close()
        self.long.close()


def _members(ctx: BuildContext, names: Sequence[str]) -> dict[str, Candidate]:
    from latencylab.optimize.families import onnxruntime, openvino

    pool = [*onnxruntime.candidates(ctx), *openvino.grid_candidates(ctx)]
    return {c.name: c for c in pool if c.name in names}


def build_runner(ctx: BuildContext, params: Mapping[str, Any], name: str = "route") -> RoutedRunner:
    from latencylab.optimize.families import onnxruntime, openvino

    short_c = onnxruntime.candidate_from_params(f"{name}/short", "routed", params["short"])
    long_c = openvino.candidate_from_params(f"{name}/long", "routed", params["long"])
    short, long = short_c.build(ctx), long_c.build(ctx)
    try:
        at = params.get("at", "auto")
        stats: dict[str, Any] = {"short": dict(getattr(short, "stats", {}) or {}),
                                 "long": dict(getattr(long, "stats", {}) or {})}  # fmt: skip
        if at == "auto":
            stats["route"] = measure_crossover(short, long, ctx.adapter.calibration())
            at = stats["route"]["at"]
            if at is None:  # the router would be its short member: nothing to measure twice
                widest = max(stats["route"]["medians_ms"], key=int)
                a, b = stats["route"]["medians_ms"][widest]
                raise NotApplicable(
                    f"{params.get('long_name', 'the long member')} is not faster than "
                    f"{params.get('short_name', 'the short member')} at any calibration width here "
                    f"(at {widest} positions: {b:.2f} vs {a:.2f} ms): the router would be its short member"
                )
        elif not isinstance(at, int) or at < 1:
            raise LatencyLabError(f"{name}: route at {at!r}: a number of positions >= 1, or 'auto'")
        else:
            stats["route"] = {"at": at}
        return RoutedRunner(short, long, at, stats)
    except BaseException:
        short.close()
        long.close()
        raise


def _skip(
    params: Mapping[str, Any], members: Callable[[BuildContext], dict[str, Candidate]]
) -> Callable[[BuildContext], str | None]:
    def why(ctx: BuildContext) -> str | None:
        try:
            from latencylab.optimize.families.openvino.common import _ov

            _ov()
        except MissingDependencyError as exc:
            return str(exc)
        if not any(width(f) for f in ctx.all_feeds()[:1]):
            return "not a sequence model: nothing to route by length"
        if not ctx.adapter.calibration():
            return "no calibration feeds to measure the crossover on"
        for role, m in members(ctx).items():
            r = m.skip_reason(ctx)
            if r:
                return f"its {role} member {m.name} skips: {r}"
        return None

    return why


def candidate_from_params(name: str, params: Mapping[str, Any], description: str = "") -> Candidate:
    """A router that rebuilds exactly from its (JSON) params: the members' whole recipes and ``at``."""
    frozen = json.loads(json.dumps(params))

    def build(ctx: BuildContext) -> RoutedRunner:
        try:
            return build_runner(ctx, frozen, name)
        except (LatencyLabError, MissingDependencyError):
            raise
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LatencyLabError(f"{name}: {type(exc).__name__}: {msg}") from exc

    def members(ctx: BuildContext) -> dict[str, Candidate]:
        from latencylab.optimize.families import onnxruntime, openvino

        return {"short": onnxruntime.candidate_from_params(frozen["short_name"], "routed", frozen["short"]),
                "long": openvino.candidate_from_params(frozen["long_name"], "routed", frozen["long"])}  # fmt: skip

    return Candidate(name, "routed", BACKEND, frozen, build, _skip(frozen, members), description)


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The routers of :data:`ROUTES` whose members the families list for this model."""
    names = {n for _, s, lg in ROUTES for n in (s, lg)}
    pool = _members(ctx, sorted(names))
    out = []
    for name, s, lg in ROUTES:
        if s not in pool or lg not in pool:
            continue
        params = {"short_name": s, "short": dict(pool[s].params), "long_name": lg, "long": dict(pool[lg].params),
                  "at": "auto"}  # fmt: skip
        desc = f"{s} below the measured crossover length, {lg} from it on (the crossover measured at build time)"
        out.append(candidate_from_params(name, params, desc))
    return out
