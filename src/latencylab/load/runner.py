"""One load test end to end: payloads, metrics scrape, generator, summary, result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from latencylab.histogram import LatencyHistogram
from latencylab.load.arrivals import ArrivalProcess
from latencylab.load.generator import AbortFn, LoadConfig, Payload, ProgressFn, Records, RunStats, run_load
from latencylab.load.reconcile import reconcile, scrape, server_stage_means
from latencylab.load.results import LoadResult, Slo, _timeline, summarize_run


def load_test(
    url: str,
    path: str,
    payloads: Sequence[Payload],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    slo: Slo | None = None,
    confidence: float = 0.99,
    seed: int = 0,
    progress: ProgressFn | None = None,
    abort_when: AbortFn | None = None,
    env: dict[str, Any] | None = None,
    target_info: dict[str, Any] | None = None,
) -> tuple[LoadResult, Records]:
    """Run one load test and build its result (with server reconciliation when /metrics is latencylab's)."""
    before = scrape(url)
    rec, run = run_load(
        url, path, payloads, arrivals, cfg, seed, progress, slo.threshold_ns if slo else None, abort_when
    )
    after = scrape(url) if before is not None else None
    summary, hists = summarize(rec, run, cfg, arrivals, slo, confidence)
    server = None
    if before is not None and after is not None and "uncorrected_mean_ms" in summary:
        stages = server_stage_means(before, after)
        server = reconcile(stages, summary["uncorrected_mean_ms"]) if stages else None
    config = asdict(cfg)
    config["seed"] = seed
    config["payloads"] = len(payloads)
    target = {"url": url, "path": path, **(target_info or {})}
    return load_result(rec, target, arrivals, config, summary, hists, env, server), rec


def summarize(
    rec: Records,
    run: RunStats,
    cfg: LoadConfig,
    arrivals: ArrivalProcess | None,
    slo: Slo | None,
    confidence: float,
) -> tuple[dict[str, Any], dict[str, LatencyHistogram]]:
    """The run's request-level summary (with ``stopped_early`` when it was) and its histograms."""
    target_rate = arrivals.mean_rate() if arrivals is not None and cfg.mode == "open" else None
    summary, hists, _ = summarize_run(rec, run, cfg, target_rate, slo, confidence)
    if run.stopped_early:
        summary["stopped_early"] = run.stopped_early
    return summary, hists


def load_result(
    rec: Records,
    target: dict[str, Any],
    arrivals: ArrivalProcess | None,
    config: dict[str, Any],
    summary: dict[str, Any],
    hists: Mapping[str, LatencyHistogram],
    env: dict[str, Any] | None,
    server: Mapping[str, Any] | None = None,
) -> LoadResult:
    """The ``load`` result of a run (``env``: this machine's fingerprint when None)."""
    if env is None:
        from latencylab.env import fingerprint

        env = fingerprint(sample_s=0.0)
    return LoadResult(
        target=target,
        arrivals=arrivals.describe() if arrivals is not None else None,
        config=config,
        summary=summary,
        histograms={k: h.to_dict() for k, h in hists.items()},
        timeline=tuple(_timeline(rec)),
        env=env,
        server=server,
    )
