"""One generative (streaming) load test end to end: prompts -> open-loop generator -> token metrics -> result.

The same generator, schedule and outcome rules as ``latencylab.load.runner.load_test``; the result is an
ordinary ``kind: "load"`` result whose summary gains a ``tokens`` object (TTFT/TPOT/ITL/E2E, output tokens,
per-objective verdicts and goodput) and whose histograms gain ``ttft_ok``, ``tpot_ok``, ``itl_ok``,
``e2e_ok`` and ``ttft_uncorrected_ok``. Readers that know only the request-level fields read it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from latencylab.load.arrivals import ArrivalProcess
from latencylab.load.gen_client import GenApi
from latencylab.load.generator import AbortFn, LoadConfig, ProgressFn, Records, RunStats, run_load
from latencylab.load.prompts import Prompt
from latencylab.load.results import LoadResult
from latencylab.load.runner import load_result, summarize
from latencylab.load.token_metrics import TokenSlo, summarize_tokens, token_arrays, token_histograms


def gen_load_test(
    url: str,
    api: GenApi,
    model: str,
    prompts: Sequence[Prompt],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    slos: Sequence[TokenSlo] = (),
    confidence: float = 0.99,
    seed: int = 0,
    progress: ProgressFn | None = None,
    abort_when: AbortFn | None = None,
    env: dict[str, Any] | None = None,
) -> tuple[LoadResult, Records]:
    """Run one streaming load test of ``api`` on ``url`` and build its result (see the module docstring)."""
    payloads = api.payloads(model, prompts)
    path = api.path(model)
    rec, run = run_load(url, path, payloads, arrivals, cfg, seed, progress, None, abort_when, stream=api)
    return gen_result(rec, run, url, api, model, prompts, arrivals, cfg, slos, confidence, seed, env), rec


def gen_result(
    rec: Records,
    run: RunStats,
    url: str,
    api: GenApi,
    model: str,
    prompts: Sequence[Prompt],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    slos: Sequence[TokenSlo] = (),
    confidence: float = 0.99,
    seed: int = 0,
    env: dict[str, Any] | None = None,
) -> LoadResult:
    """The ``load`` result of a streaming run's records (``Records.traces`` set): request-level summary and
    histograms plus the token metrics. Separate from the run so that recorded or synthetic records make the
    same document."""
    summary, hists = summarize(rec, run, cfg, arrivals, None, confidence)
    arr = token_arrays(rec)
    tokens = summarize_tokens(rec, arr, run.wall_s, slos, confidence)
    summary["tokens"] = tokens
    if slos:
        summary["goodput"] = tokens["goodput"]
    if arr.n == 0 and summary["ok"]:
        summary["warnings"].append("no successful request was streamed: no TTFT, TPOT or ITL")
    hists.update(token_histograms(arr))
    config = asdict(cfg)
    config.update(
        seed=seed, payloads=len(prompts), api=api.name,
        max_tokens=sorted({p.max_tokens for p in prompts}), prompt_chars=sorted({p.chars for p in prompts}),
        slos=[s.describe() for s in slos],
    )  # fmt: skip
    target = {"url": url, "path": api.path(model), "model": model, "api": api.name}
    return load_result(rec, target, arrivals, config, summary, hists, env)
