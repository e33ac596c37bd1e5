"""``latencylab load --api ... --find-capacity``: the capacity of a generative endpoint at a goodput SLO.

The search is ``latencylab.load.capacity.search_capacity`` (the same bracket, bisection and statistical
stopping rule as the single-shot ``--find-capacity``); only what a chunk yields differs. Each chunk is one
streaming Poisson run (``gen_load_test``), and each of its requests is judged as the search judges a request:

* *failed*: shed or failed (the stream broke, an error event, a timeout): counted against the 1% limit;
* *late*: succeeded but missed **any** of the stated token objectives (``ttft_p99=2s``, ``tpot_p99=250ms``,
  ``e2e_...``), each judged on the request's own TTFT / TPOT / E2E from the intended send time;
* *ok*: succeeded within every objective.

A step passes when at most ``1 - q`` of its successful requests were late and at most 1% failed (each decided
as the search decides it). Every objective must state the same percentile ``q``: "p99 of the requests meet
every objective" is goodput's attainment (DistServe's and vLLM's sense), and is at least as strict as each
objective on its own. The capacity is the highest Poisson rate that passes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import Poisson
from latencylab.load.gen_client import GenApi
from latencylab.load.generator import LoadConfig, Records
from latencylab.load.prompts import Prompt
from latencylab.load.results import LoadResult, Slo
from latencylab.load.token_metrics import TokenSlo, per_request_within, token_arrays


@dataclasses.dataclass(frozen=True, slots=True)
class GoodputSlo(Slo):
    """Several token objectives at one percentile, judged jointly per request (``q``: that percentile;
    ``threshold_ns``: the first objective's, for figures that draw one line)."""

    objectives: tuple[TokenSlo, ...] = ()

    @classmethod
    def of(cls, slos: Sequence[TokenSlo]) -> GoodputSlo:
        if not slos:
            raise LatencyLabError("--find-capacity with --api needs --slo, e.g. --slo ttft_p99=2s --slo tpot_p99=250ms")
        qs = {s.q for s in slos}
        if len(qs) > 1:
            raise LatencyLabError(
                "--find-capacity judges one percentile: every --slo must state the same one "
                f"(got {', '.join(s.describe() for s in slos)})"
            )
        return cls(slos[0].q, slos[0].threshold_ns, tuple(slos))

    def describe(self) -> str:
        return " & ".join(s.describe() for s in self.objectives)


def missed_any(rec: Records, slos: Sequence[TokenSlo]) -> np.ndarray:
    """Per request of a run: it missed at least one objective (True for a successful request with no token
    metrics, e.g. a one-shot answer judged on TTFT; failed requests are the search's ``failed``, not this)."""
    arr = token_arrays(rec)
    within = np.ones(arr.n, dtype=bool)
    for slo in slos:
        within &= per_request_within(arr, slo)
    missed = np.ones(rec.n, dtype=bool)
    missed[arr.request] = ~within
    if arr.one_shot and all(s.metric == "e2e" for s in slos):  # a one-shot answer has an E2E to judge
        e2e = rec.done_ns - rec.intended_ns
        one = np.array([tr is not None and not tr.streamed for tr in (rec.traces or [None] * rec.n)], dtype=bool)
        one &= rec.outcome == 0
        missed[one] = np.any([e2e[one] > s.threshold_ns for s in slos], axis=0)
    return missed


def gen_segment(rate: float, result: LoadResult, rec: Records, slos: Sequence[TokenSlo]) -> Any:
    """One streaming run as ``search_capacity`` judges it: a ``Segment`` whose ``missed`` flags the requests
    that missed any objective."""
    from latencylab.load.capacity import Segment

    return dataclasses.replace(Segment.from_run(rate, result, rec), missed=missed_any(rec, slos))


def _pooled_p99(values: list[np.ndarray]) -> float | None:
    v = np.concatenate(values) if values else np.array([])
    v = np.sort(v[~np.isnan(v)])
    return float(v[max(0, math.ceil(0.99 * v.size) - 1)]) / 1e6 if v.size else None


def run_gen_capacity(
    opts: Any,
    console: Console,
    url: str,
    api: GenApi,
    prompts: Sequence[Prompt],
    slos: Sequence[TokenSlo],
    headers: dict[str, str],
    env: dict[str, Any],
    run: Callable[..., tuple[LoadResult, Records]] | None = None,
) -> int:
    """``repeat_capacity`` over streaming Poisson runs, printed step by step; ``--json`` writes a ``capacity``
    result (the single-shot search's layout, each step with its TTFT and TPOT p99)."""
    from latencylab.load.capacity import SearchConfig, repeat_capacity
    from latencylab.load.gen_runner import gen_load_test

    slo = GoodputSlo.of(slos)
    if api.name == "generate" and any(s.metric != "e2e" for s in slos):
        raise LatencyLabError("--api generate answers in one piece (no TTFT or TPOT): search on e2e_... objectives")
    try:
        search = SearchConfig(
            start_rate=opts.start_rate, max_rate=opts.max_rate, precision=opts.precision,
            chunk_s=opts.step_duration, max_chunks=max(opts.max_chunks, 3), warmup_s=opts.warmup,
            search_warmup_s=min(5.0, opts.step_duration), confidence=opts.confidence,
            # the generator's own abort rule counts end-to-end latency; token objectives are judged per chunk
            early_stop=False, refine_rounds=opts.refine_rounds,
        )  # fmt: skip
    except ValueError as exc:
        raise LatencyLabError(f"--find-capacity: {exc}") from exc
    runner = run or gen_load_test
    warm_ns = int(search.warmup_s * 1e9)
    pending: list[tuple[float, np.ndarray, np.ndarray]] = []  # (rate, TTFT, TPOT) of the chunks since a step
    warm_up_left = [search.search_warmup_s > 0]  # the search's first run is its discarded warm-up

    def measure(rate: float, seconds: float, seed: int, abort_when: Any) -> Any:
        cfg = LoadConfig(
            duration_s=seconds, timeout_s=opts.timeout, connections=opts.connections, headers=headers,
            request_start_header=opts.request_start_header, spin=opts.spin,
        )  # fmt: skip
        res, rec = runner(url, api, opts.model, prompts, Poisson(rate, seed), cfg, slos, opts.confidence, seed,
                       abort_when=abort_when, env=env)  # fmt: skip
        if warm_up_left[0]:
            warm_up_left[0] = False
        else:
            arr = token_arrays(rec)
            keep = rec.intended_ns[arr.request] >= warm_ns
            pending.append((rate, arr.ttft_ns[keep].astype(float), arr.tpot_ns[keep]))
        return gen_segment(rate, res, rec, slos)

    def on_step(step: dict[str, Any]) -> None:
        mine = [p for p in pending if p[0] == step["offered_rate"]]
        step["ttft_p99_ms"] = _pooled_p99([p[1] for p in mine])
        step["tpot_p99_ms"] = _pooled_p99([p[2] for p in mine])
        if step.get("phase") != "refine":  # the refine rows come together after all their chunks
            pending.clear()
        mark = {"pass": "pass", "fail": "FAIL"}.get(step["verdict"], "pass?" if step["passed"] else "FAIL?")
        tok = "  ".join(
            f"{k} p99 {'-' if step[f'{k}_p99_ms'] is None else format(step[f'{k}_p99_ms'], '.1f') + ' ms'}"
            for k in ("ttft", "tpot")
        )
        console.print(
            escape(
                f"  {'refined' if step.get('phase') == 'refine' else 'offered'} {step['offered_rate']:.2f}/s  "
                f"achieved {step.get('achieved_rate') or 0:.2f}/s  "
                f"{step['chunks']} x {opts.step_duration:g} s  {tok}  {mark}: {step['why']}"
            )
        )

    def on_search(r: int, cap: Any) -> None:
        warm_up_left[0] = search.search_warmup_s > 0  # the next search warms up again
        rate = "none" if cap.capacity_rate is None else f"{cap.capacity_rate:.2f}/s"
        console.print(escape(f"search {r + 1} of {opts.repeat}: capacity {rate} ({cap.reason})"))

    console.print(escape(f"capacity search for {slo.describe()} ({stats.format_q(slo.q)} of requests meet "
                         f"every objective, <= {search.max_error_fraction:.0%} shed or failed) on {url}"
                         f"{api.path(opts.model)}"))  # fmt: skip
    spread = repeat_capacity(measure, slo, search, opts.repeat, opts.seed, on_step, on_search)
    good = "-" if spread.goodput is None else f"{spread.goodput:.2f}/s"
    console.print(escape(f"capacity: {spread.describe()} offered, goodput {good}"))
    first = spread.searches[0]
    if opts.plot:
        from latencylab.load.plots import plot_capacity

        out = Path(opts.plot) / "capacity.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        console.print(escape(f"wrote {plot_capacity(first.steps, out, None)}"))
    if opts.json:
        doc = spread.result_doc(search, env, objectives=[s.describe() for s in slos], api=api.name)
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(doc, indent=1))
        console.print(escape(f"wrote {opts.json}"))
    return 0
