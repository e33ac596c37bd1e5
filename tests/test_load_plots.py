"""Load-run plots, drawn from simulated runs (no server): files, sizes, content."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
PIL_Image = pytest.importorskip("PIL.Image")

from latencylab.errors import LatencyLabError, MissingDependencyError  # noqa: E402
from latencylab.load import plots  # noqa: E402
from latencylab.load.generator import LoadConfig, Records, RunStats  # noqa: E402
from latencylab.load.results import LoadResult, Slo, _timeline, summarize_run  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZE = (1100, 605)  # plots.FIGSIZE (10 x 5.5 in) at 110 dpi
SLO_RGB = (214, 39, 40)  # plots._SLO, #d62728


def _simulate(
    rate: float = 200.0,
    duration_s: float = 10.0,
    connections: int = 8,
    stall: tuple[float, float] | None = (4.0, 5.5),
    seed: int = 0,
) -> tuple[Records, RunStats]:
    """An open-loop run against a server that stalls, through a fixed pool of connections.

    Requests arrive as a Poisson process; each is sent on the first free connection (so while the
    server stalls, the pool fills and requests wait to be sent: lateness, coordinated omission);
    service times are lognormal around 5 ms. Right after the stall the server sheds ~30% of requests
    for half a second, and three requests fail.
    """
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s)
    intended = np.cumsum(rng.exponential(1e9 / rate, n)).astype(np.int64)
    intended = intended[intended < duration_s * 1e9]
    n = intended.size
    service = (5e6 * rng.lognormal(0.0, 0.4, n)).astype(np.int64)
    free = np.zeros(connections, dtype=np.int64)
    sent = np.empty(n, dtype=np.int64)
    done = np.empty(n, dtype=np.int64)
    for i in range(n):
        c = int(np.argmin(free))
        sent[i] = max(intended[i], free[c]) + 20_000  # 20 us of client overhead
        finish = sent[i] + service[i]
        if stall is not None:
            s0, s1 = int(stall[0] * 1e9), int(stall[1] * 1e9)
            if sent[i] < s1 and finish > s0:
                finish = s1 + service[i]
        done[i] = finish
        free[c] = finish
    outcome = np.zeros(n, dtype=np.int8)
    if stall is not None:
        after = (sent >= stall[1] * 1e9) & (sent < (stall[1] + 0.5) * 1e9)
        outcome[after & (rng.random(n) < 0.3)] = 1
    outcome[rng.choice(n, 3, replace=False)] = 2
    rec = Records(
        intended_ns=intended,
        sent_ns=sent,
        done_ns=done,
        outcome=outcome,
        status=np.where(outcome == 0, 200, np.where(outcome == 1, 503, 500)).astype(np.int16),
        payload=np.zeros(n, dtype=np.int32),
        errors={"http 500": 3},
        retry_after=[],
    )
    run = RunStats(
        wall_s=float(done.max()) / 1e9,
        send_span_s=float(intended[-1] - intended[0]) / 1e9,
        cpu_s=0.4,
        connections_opened=connections,
        max_in_flight=connections,
    )
    return rec, run


def _result(slo: str | None = "p99=100ms", capacity: dict | None = None, **kw: object) -> LoadResult:
    rec, run = _simulate(**kw)  # type: ignore[arg-type]
    cfg = LoadConfig(mode="open", duration_s=10.0, connections=8)
    summary, hists, _ = summarize_run(rec, run, cfg, 200.0, Slo.parse(slo) if slo else None)
    return LoadResult(
        target={"url": "http://127.0.0.1:0", "path": "/v2/models/m/infer"},
        arrivals={"kind": "poisson", "rate": 200.0},
        config={"mode": "open"},
        summary=summary,
        histograms={k: h.to_dict() for k, h in hists.items()},
        timeline=tuple(_timeline(rec)),
        env={},
        capacity=capacity,
    )


STEPS = [  # a bracket-then-bisect search: the classic hockey stick, in the order run
    {"offered_rate": 50.0, "achieved_rate": 49.6, "p50_ms": 5.1, "p99_ms": 9.8, "passed": True},
    {"offered_rate": 100.0, "achieved_rate": 99.1, "p50_ms": 5.3, "p99_ms": 12.0, "passed": True},
    {"offered_rate": 200.0, "achieved_rate": 198.7, "p50_ms": 5.9, "p99_ms": 21.0, "passed": True},
    {"offered_rate": 400.0, "achieved_rate": 371.0, "p50_ms": 180.0, "p99_ms": 2400.0, "passed": False},
    {"offered_rate": 300.0, "achieved_rate": 297.5, "p50_ms": 8.0, "p99_ms": 64.0, "passed": True},
    {"offered_rate": 350.0, "achieved_rate": 342.0, "p50_ms": 19.0, "p99_ms": 230.0, "passed": False},
    {"offered_rate": 325.0, "achieved_rate": 321.8, "p50_ms": 11.0, "p99_ms": 95.0, "passed": True},
    {"offered_rate": 337.5, "achieved_rate": 333.0, "p50_ms": None, "p99_ms": None, "passed": False},
]


def _check_png(path: Path, size: tuple[int, int] = SIZE) -> np.ndarray:
    assert path.exists() and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == PNG_MAGIC
    with PIL_Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == size
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.std() > 20  # not blank
    colours = {tuple(c) for c in rgb.reshape(-1, 3)[::7]}
    assert len(colours) > 50  # lines, text, grid, fills: many distinct colours
    return rgb


def _near(rgb: np.ndarray, colour: tuple[int, int, int], tol: int = 12) -> int:
    """Pixels within ``tol`` of ``colour`` on every channel."""
    return int((np.abs(rgb.astype(int) - np.array(colour)) <= tol).all(axis=-1).sum())


@pytest.fixture(scope="module")
def result() -> LoadResult:
    return _result()


def test_the_simulated_run_shows_coordinated_omission(result: LoadResult) -> None:
    s = result.summary
    assert s["shed"] > 20 and s["error"] == 3
    assert s["p99_ms"] > 500 > 10 * s["uncorrected_p99_ms"]  # queued behind the stall, not timed from intent
    assert s["coordinated_omission"] is not None
    assert len(result.timeline) == 10


def test_latency_over_time(result: LoadResult, tmp_path: Path) -> None:
    out = plots.plot_latency_over_time(result, tmp_path / "sub" / "time.png")
    assert out == tmp_path / "sub" / "time.png"
    rgb = _check_png(out)
    assert _near(rgb, SLO_RGB) > 300  # the run's SLO, p99<=100ms, drawn as a dashed line


def test_latency_over_time_without_slo_or_failures(tmp_path: Path) -> None:
    res = _result(slo=None, stall=None)
    assert res.summary["shed"] == 0
    rgb = _check_png(plots.plot_latency_over_time(res, tmp_path / "time.png"))
    assert _near(rgb, SLO_RGB) == 0
    rgb = _check_png(plots.plot_latency_over_time(res, tmp_path / "time_slo.png", slo_ms=20))
    assert _near(rgb, SLO_RGB) > 300


def test_cdf(result: LoadResult, tmp_path: Path) -> None:
    rgb = _check_png(plots.plot_cdf(result, tmp_path / "cdf.png"))
    assert _near(rgb, (31, 119, 180)) > 500 and _near(rgb, (255, 127, 14)) > 500  # both latency curves


def test_capacity(tmp_path: Path) -> None:
    _check_png(plots.plot_capacity(STEPS, tmp_path / "cap.png", slo_ms=100))
    _check_png(plots.plot_capacity(STEPS, tmp_path / "cap_tp.png", slo_ms=None, x="offered_rate"))
    with pytest.raises(LatencyLabError, match="unknown x"):
        plots.plot_capacity(STEPS, tmp_path / "x.png", x="speed")
    with pytest.raises(LatencyLabError, match="no capacity step"):
        plots.plot_capacity([{"offered_rate": 10.0, "p99_ms": None, "passed": False}], tmp_path / "x.png")


def test_a_saved_result_plots_the_same(result: LoadResult, tmp_path: Path) -> None:
    loaded = LoadResult.from_dict(json.loads(json.dumps(result.to_dict())))
    a = plots.plot_load(result, tmp_path / "a")
    b = plots.plot_load(loaded, tmp_path / "b")
    for pa, pb in zip(a, b, strict=True):
        with PIL_Image.open(pa) as ia, PIL_Image.open(pb) as ib:
            assert np.array_equal(np.asarray(ia), np.asarray(ib)), pa.name


def test_plot_load_writes_what_applies(result: LoadResult, tmp_path: Path) -> None:
    paths = plots.plot_load(result, tmp_path / "a")
    assert [p.name for p in paths] == ["latency_over_time.png", "latency_cdf.png"]
    paths = plots.plot_load(result, tmp_path / "b", capacity_steps=STEPS)
    assert [p.name for p in paths] == ["latency_over_time.png", "latency_cdf.png", "capacity.png"]
    for p in paths:
        _check_png(p)
    with_cap = _result(capacity={"slo": "p99<=100ms", "steps": STEPS})
    assert [p.name for p in plots.plot_load(with_cap, tmp_path / "c")][-1] == "capacity.png"
    small = plots.plot_load(result, tmp_path / "d", dpi=55)
    _check_png(small[0], size=(550, 302))


def test_empty_run_is_an_error_not_a_blank_plot(result: LoadResult, tmp_path: Path) -> None:
    empty = LoadResult({}, None, {}, {"mode": "open"}, {}, (), {})
    with pytest.raises(LatencyLabError, match="no timeline"):
        plots.plot_latency_over_time(empty, tmp_path / "x.png")
    assert plots.plot_load(empty, tmp_path) == []


@pytest.mark.parametrize(
    ("text", "ms"), [("p99<=100ms", 100.0), ("p99.9<=0.25s", 250.0), ("p50=500us", 0.5), ("p99 ≤ 2ms", 2.0)]
)
def test_objective_threshold(text: str, ms: float) -> None:
    assert plots.objective_threshold_ms(text) == pytest.approx(ms)


def test_missing_matplotlib_gives_an_install_hint(
    result: LoadResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'latencylab\[plot\]'"):
        plots.plot_cdf(result, tmp_path / "cdf.png")
    assert not (tmp_path / "cdf.png").exists()
