"""Two result files in, one :class:`~latencylab.compare.model.Comparison` out: each result's latency
series, rate counts, environment and configuration read (profile and load results), the level chosen
(iteration, run, paired), every shared series compared (:mod:`.series`) and the gates judged."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab.canary import compare_canaries
from latencylab.compare import stats as cstats
from latencylab.compare.model import NOISE, ONE_RUN, RATE_METRICS, Comparison, Difference, Gate
from latencylab.compare.series import compare_rates, compare_runs_series, compare_series, evaluate_gate
from latencylab.compare.stats import MetricDelta
from latencylab.errors import LatencyLabError
from latencylab.results import read_result


@dataclass(frozen=True, slots=True)
class _Side:
    """What compare needs from one result: its latency series, rate counts, env and config."""

    series: dict[str, cstats.Binned]
    ok: int | None
    sent: int | None
    seconds: float | None
    env: Mapping[str, Any]
    config: Mapping[str, Any]
    runs: Mapping[str, list[npt.NDArray[np.int64]]] | None = None  # series -> one sample array per run
    session: str | None = None  # the interleaved session the result was measured in

    @property
    def n_runs(self) -> int:
        return len(next(iter(self.runs.values()))) if self.runs else 1


def _profile_side(doc: Mapping[str, Any]) -> _Side:
    from latencylab.results import ProfileResult

    r = ProfileResult.from_dict(doc)
    arrays = {"end-to-end": r.end_to_end_ns(), **{s.name: s.array() for s in r.stages}}
    series = {k: cstats.Binned.from_samples(v, ordered=True) for k, v in arrays.items()}
    slices = r.run_slices()
    runs = {k: [v[sl] for sl in slices] for k, v in arrays.items()}
    config = {"workload": r.workload, "config": dict(r.config), "pipeline": dict(r.pipeline)}
    inter = r.config.get("interleaved")
    session = str(inter["session"]) if isinstance(inter, Mapping) and "session" in inter else None
    return _Side(series, None, None, None, r.env, config, runs, session)


LOAD_SERIES = {"latency": "corrected_ok", "uncorrected": "uncorrected_ok"}
# A generative (streaming) load result's token metrics (load.token_metrics): one series each, so that the
# gates "ttft:p99>+5%" (or its alias "ttft_p99>+5%", model.TOKEN_SERIES) judge them as any latency series.
TOKEN_LOAD_SERIES = {"ttft": "ttft_ok", "tpot": "tpot_ok", "itl": "itl_ok", "e2e": "e2e_ok"}


def _load_side(doc: Mapping[str, Any]) -> _Side:
    from latencylab.histogram import LatencyHistogram
    from latencylab.results import kind_version

    if doc.get("schema_version") != kind_version("load"):
        raise LatencyLabError(f"unsupported load result schema_version {doc.get('schema_version')!r}")
    try:
        hists, summary = doc["histograms"], doc["summary"]
        series = {}
        for name, key in (LOAD_SERIES | TOKEN_LOAD_SERIES).items():
            if key in hists:
                h = LatencyHistogram.from_dict(dict(hists[key]))
                if h.count:
                    series[name] = cstats.Binned.from_cdf(h.cdf(), h.count)
        config = {"target": doc.get("target"), "arrivals": doc.get("arrivals"), "config": doc.get("config")}
        return _Side(
            series,
            int(summary["ok"]),
            int(summary["sent"]),
            float(summary["duration_s"]),
            doc.get("env") or {},
            config,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LatencyLabError(f"malformed load result: {exc!r}") from None


def _check_kind(doc: Mapping[str, Any], path: str) -> str:
    kind = doc.get("kind")
    if kind in ("profile", "load"):
        return str(kind)
    why = "compare reads profile and load results"
    if kind == "optimize":
        why = "an optimize result keeps summaries, not latency samples; " + why
    raise LatencyLabError(f"{path}: cannot compare kind {kind!r} ({why})")


def _side(doc: Mapping[str, Any]) -> _Side:
    return _profile_side(doc) if doc.get("kind") == "profile" else _load_side(doc)


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for k, v in node.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Difference, ...]:
    fa, fb = dict(_flatten(a)), dict(_flatten(b))
    return tuple(Difference(k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k))


def env_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Difference, ...]:
    """High- and medium-impact differences from ``latencylab.env.diff`` (low-impact ones rarely explain a change)."""
    from latencylab.env import diff

    if not a or not b:
        return ()
    return tuple(Difference(d.path, d.a, d.b, d.impact) for d in diff(dict(a), dict(b)) if d.impact != "low")


def _busy(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str]) -> list[tuple[str, str]]:
    """``env`` lint's "machine is busy" for each side: load is volatile, so env.diff ignores it, yet a run
    measured beside other work differs from one measured alone, whatever the configuration."""
    from latencylab.env import lint

    return [
        (who, w.message)
        for who, fp in zip(names, (a, b), strict=True)
        if fp
        for w in lint(dict(fp))
        if w.code == "busy"
    ]


def compare_docs(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    gates: Sequence[Gate] = (),
    alpha: float = 0.05,
    noise: float = NOISE,
    n_boot: int = cstats.DEFAULT_BOOT,
    seed: int = 0,
    names: tuple[str, str] = ("baseline", "candidate"),
    strict: bool = False,
) -> Comparison:
    """Compare two parsed result documents of the same kind (see the module docstring).

    ``strict``: an undecided gate (one run a side, or the canary moved) fires when its evidence says so.
    """
    if not 0 < alpha < 1:
        raise LatencyLabError(f"alpha must be in (0, 1), got {alpha}")
    ka, kb = _check_kind(baseline, names[0]), _check_kind(candidate, names[1])
    if ka != kb:
        raise LatencyLabError(f"cannot compare a {ka} result with a {kb} result")
    a, b = _side(baseline), _side(candidate)
    common = [n for n in a.series if n in b.series]
    if not common:
        raise LatencyLabError("the two results share no latency series (no stage names in common, or no samples)")
    notes = [f"{who} was measured on a busy machine: {msg}" for who, msg in _busy(a.env, b.env, names)]
    notes += [f"only in {names[0]}: {n}" for n in a.series if n not in b.series]
    notes += [f"only in {names[1]}: {n}" for n in b.series if n not in a.series]
    default = common[0]
    for g in gates:  # check before the (seconds-long) bootstrap
        if g.metric in RATE_METRICS and ka != "load":
            raise LatencyLabError(f"gate {g.text!r}: {g.metric} exists for load results only")
        if g.series is not None and g.series not in common:
            raise LatencyLabError(f"gate {g.text!r}: no series {g.series!r} in both results ({', '.join(common)})")
    level = "iteration"
    if max(a.n_runs, b.n_runs) >= 2:
        paired = a.session is not None and a.session == b.session and a.n_runs == b.n_runs
        level = "paired" if paired else "run"
    if level == "iteration":
        series = tuple(
            compare_series(n, a.series[n], b.series[n], alpha, noise, n_boot, seed + i) for i, n in enumerate(common)
        )
    else:
        assert a.runs is not None and b.runs is not None
        series = tuple(compare_runs_series(n, a.runs[n], b.runs[n], alpha, noise, level == "paired") for n in common)
    canary = compare_canaries(a.env.get("canary"), b.env.get("canary"))
    refuse = [ONE_RUN] if level == "iteration" else []
    if canary is not None and level != "paired":
        notes.append("canary: " + canary.describe(names) + (
            f": more than the {canary.threshold:.0%} threshold, so no gate can be decided on these results"
            if canary.moved else f", within the {canary.threshold:.0%} threshold"
        ))  # fmt: skip
        if canary.moved:
            refuse.append(canary.describe(names))
    for who, side in zip(names, (a, b), strict=True):
        if level == "paired":
            who = f"{names[0]} and {names[1]} were"  # one session, one canary
        else:
            who += " was"
        c = side.env.get("canary")
        drift = c.get("drift") if isinstance(c, Mapping) else None
        if isinstance(drift, (int, float)) and drift > (canary.threshold if canary else 0.10):
            notes.append(f"the machine's speed moved {drift:.0%} while {who} measured (canary readings)")
        steal = c.get("steal_fraction") if isinstance(c, Mapping) else None
        if isinstance(steal, (int, float)) and steal > 0.05:
            notes.append(f"the hypervisor took {steal:.0%} of the CPU time while {who} measured (steal)")
        if level == "paired":
            break  # one session, one canary
    rates: tuple[MetricDelta, ...] = ()
    if ka == "load" and a.sent is not None and b.sent is not None:
        assert a.ok is not None and b.ok is not None and a.seconds is not None and b.seconds is not None
        rates = compare_rates((a.ok, b.ok), (a.sent, b.sent), (a.seconds, b.seconds), alpha, noise)
    results = []
    for g in gates:
        name = g.series or default
        why = "; and ".join(refuse)
        if g.metric in RATE_METRICS:
            found = [r for r in rates if r.metric == g.metric]
            if not found:
                raise LatencyLabError(f"gate {g.text!r}: the results do not record {g.metric}")
            results.append(evaluate_gate(g, "run", found[0], why, strict))
        else:
            s = next(s for s in series if s.name == name)
            results.append(evaluate_gate(g, name, s.metric(g.metric), why, strict))
    return Comparison(
        result_kind=str(ka),
        baseline=names[0],
        candidate=names[1],
        alpha=alpha,
        noise=noise,
        n_boot=n_boot,
        seed=seed,
        series=series,
        rates=rates,
        env=env_differences(a.env, b.env),
        config=config_differences(a.config, b.config),
        gates=tuple(results),
        notes=tuple(notes),
        level=level,
        strict=strict,
        canary=canary,
    )


def compare_files(
    baseline: str | Path,
    candidate: str | Path,
    gates: Sequence[str] = (),
    alpha: float = 0.05,
    noise: float = NOISE,
    n_boot: int = cstats.DEFAULT_BOOT,
    seed: int = 0,
    strict: bool = False,
) -> Comparison:
    """``latencylab compare`` as a function: gates are parsed first, so a bad one fails before any work."""
    parsed = [Gate.parse(g) for g in gates]
    return compare_docs(
        read_result(baseline).doc,
        read_result(candidate).doc,
        parsed,
        alpha,
        noise,
        n_boot,
        seed,
        names=(str(baseline), str(candidate)),
        strict=strict,
    )
