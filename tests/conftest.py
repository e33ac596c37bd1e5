"""Shared test set-up: offline model hubs, a private cache, the slow tier, and the machine-noise precondition.

Tiers. ``make test-fast`` (``-m "not slow"``) is the unit tier, under 2 minutes on 2 cores: fake clocks and
fake variants, no real model (MiniLM, the vision CNN), no browser, no server process, no optimize search.
Everything else is marked ``slow`` and runs in ``make test``: with ``@pytest.mark.slow`` where it is written,
or listed in ``SLOW`` below (modules whose every test is heavy, and the heavy tests, or the fixtures that
make a test heavy, of mixed modules).

Tests that judge real wall-clock behaviour (a busy-wait measured to 5%, a timer that must fire within a
few ms) cannot pass on a machine whose cores are taken by other work, however correct the program. Such a
test states its precondition through the ``machine_noise`` fixture: the fixture measures, just before the
test, how much of a spinning thread's time the scheduler takes away and how late a 1-ms sleep wakes up;
``machine_noise.require(...)`` skips the test with those numbers when they exceed what the test can
tolerate. A test whose judgement failed can measure again (``machine_noise.recheck(...)``) and skip when the
machine turned noisy while it ran; on a quiet machine the failure stands. A single-threaded measurement can
do better and ask the kernel how long its own thread was kept off the CPU while it ran (``Watch``): its
judgement then holds or is set aside by what happened during it, not around it.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

import serial_lock
import xdist_order

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# "module" (every test in it) or "module::name" (the test so named, or every test using the fixture so named).
SLOW: dict[str, str] = {
    "test_vision.py": "trains and runs the vision CNN",
    "test_text.py": "runs MiniLM",
    "test_serve_ort_text.py": "exports MiniLM to ONNX and serves it",
    "test_serve_variants.py::text_variants": "builds every rung of the text ladder (MiniLM)",
    "test_serve_variants.py::vision_variants": "builds every rung of the vision ladder",
    "test_serve_process.py": "starts server processes",
    "test_peer_mlserver.py": "starts MLServer processes (benchmarks/peers/mlserver_setup.sh)",
    "test_report_html.py::inputs": "profiles, loads and optimizes through the CLI for the report's inputs",
    "test_report_html.py::report": "renders a report of real results (and Chromium screenshots it)",
    "test_report_html.py::test_optimize_headline_splits_the_speedup": "renders every optimize figure (~10 s)",
    "test_roofline.py::test_roofline_findings_on_the_vision_workload": "times the vision CNN at each precision",
    "test_optimize_lab.py": "runs the optimize lab",
    "test_optimize_torch.py::vision_ctx": "builds torch candidates of the vision CNN",
    "test_optimize_torch.py::text_ctx": "builds torch candidates of MiniLM",
    "test_optimize_ort.py::vision": "builds ONNX Runtime candidates of the vision CNN",
    "test_optimize_ort.py::text": "builds ONNX Runtime candidates of MiniLM",
    "test_optimize_experiments.py::minilm": "runs MiniLM",
    "test_optimize_experiments.py::test_pipeline_overlap_counts_and_sanity_throughput": "seconds of real work",
    "test_compare.py::real_runs": "three real profile runs through the CLI",
    "test_budget.py::test_cli_profile_exit_code_follows_the_budget": "three real profile runs through the CLI",
    "test_load.py::test_slo_verdict_and_early_abort": "a real load run against a server process",
    "test_load.py::test_cli_early_stop_when_the_slo_verdict_is_decided": "a real load run through the CLI",
    "test_load.py::test_cli_load_json_and_jsonl": "a real load run through the CLI",
    "test_load_early_stop.py::test_a_burst_at_the_start_of_a_real_run_does_not_stop_it": "a real load run",
    "test_gen_capacity.py::test_cli_capacity_of_the_queueing_reference_server_is_bracketed": "a capacity search",
    "test_gen_workload.py::test_fidelity_reference_and_score": "greedy answers and perplexity over the prompt set",
    "test_gen_workload.py::test_kv_cache_off_gives_the_same_tokens": "decodes the prompt set twice (~10 s)",
    "test_gen_speculative.py::test_sampled_speculative_output_is_distributed_as_the_target": "thousands of samples",
    # real server processes and real-time judgements, 1.5-5 s each (issue 16: test-fast was 203 s with them)
    "test_genserve_http.py::test_the_load_generator_drives_it_unchanged": "a real load run against the gen app",
    "test_genserve_http.py::test_a_slow_reader_does_not_hold_up_the_batch": "token timing on a real server",
    "test_compare_gen.py::test_cli_fails_on_a_token_gate": "real load runs through the CLI",
    "test_diagnose_pipelines.py::test_data_path_share_and_the_python_function": "a real profile run",
    "test_diagnose_pipelines.py::test_repeated_pauses_named_with_stage_period_iterations_and_effect": "real pauses",
    "test_diagnose_pipelines.py::test_deep_on_a_pipeline_result_reimports_its_factory_not_a_namesake": "--deep",
    "test_diagnose_pipelines.py::test_clean_control_gives_no_finding_on_a_quiet_machine": "a real profile run",
    "test_diagnose_pipelines.py::test_a_cycled_input_set_is_no_periodic_finding": "a real profile run",
    "test_load_stream.py": "real streaming servers",
    "test_optimize_openvino.py::test_every_candidate_runs_close_to_fp32": "builds every OpenVINO candidate",
    "test_diagnose_gen.py::test_one_stream_at_a_time_stalls_on_the_reference_server": "a real load run",
    "test_load_plots.py::test_plot_load_writes_what_applies": "a real load run and its plots",
    "test_load.py": "real reference servers and load runs",
    "test_load_pacing.py": "times the load generator's pacing",
    "test_profiler.py::test_real_clock_percentiles_within_3pct_of_truth": "percentiles on the real clock",
    "test_profiler.py::test_injected_stall_on_real_clock_is_detected": "a stall on the real clock",
    "test_compare_runs.py::test_cli_interleaved_run_catches_a_slower_stage_and_passes_an_unchanged_one": "real runs",
    "test_noise.py": "measures the machine's own noise",
}


# Tests that judge real wall-clock behaviour (a percentile against a known truth, a capacity search, a stall or a
# timer they must see): `make test` runs two pytest-xdist workers, and each of these runs alone
# (tests/serial_lock.py). Every test that asks for the ``machine_noise`` fixture is serial too, and a test may
# say ``@pytest.mark.serial`` where it is written. Same keys as ``SLOW``.
SERIAL: dict[str, str] = {
    "test_noise.py": "measures the machine's own noise",
    "test_load_pacing.py": "times the load generator's pacing",
    "test_load_capacity_reference.py": "capacity against the M/D/1 truth",
    "test_diagnose_gen.py::test_one_stream_at_a_time_stalls_on_the_reference_server": "a stall it must see",
    "test_genserve_http.py::test_a_client_that_disconnects_frees_its_slot_within_a_step": "within one step",
    "test_genserve_http.py::test_a_slow_reader_does_not_hold_up_the_batch": "token timing of the others",
    "test_load.py::test_percentiles_within_3pct_of_known_service_times": "percentiles against the truth",
    "test_load.py::test_open_loop_shows_a_stall_that_closed_loop_hides": "a stall it must see",
    "test_load.py::test_slo_verdict_and_early_abort": "an SLO verdict on real latencies",
    "test_load.py::test_cli_early_stop_when_the_slo_verdict_is_decided": "an SLO verdict on real latencies",
    "test_load.py::test_timeouts_are_errors_not_drops": "timeouts racing real service times",
    "test_load.py::test_min_requests_extends_the_run": "a run's length in real time",
    "test_load_early_stop.py::test_a_burst_at_the_start_of_a_real_run_does_not_stop_it": "an SLO verdict",
    "test_load_stream.py::test_a_stalled_stream_shows_in_itl_p99": "a stall it must see",
    "test_gen_capacity.py::test_cli_capacity_of_the_queueing_reference_server_is_bracketed": "a capacity search",
    "test_profiler.py::test_min_time_rule_runs_at_least_that_long": "a run's length in real time",
    "test_diagnose_pipelines.py::test_repeated_pauses_named_with_stage_period_iterations_and_effect": "pauses",
    "test_compare.py::test_two_real_runs_of_one_configuration_do_not_differ": "no false alarm on real runs",
    "test_compare_runs.py::test_cli_interleaved_run_catches_a_slower_stage_and_passes_an_unchanged_one": "A/B",
    "test_budget.py::test_cli_profile_exit_code_follows_the_budget": "a latency budget on real runs",
    "test_serve_app.py::test_hung_model_gives_deadline_errors_not_a_hung_server": "deadlines in real time",
    "test_serve_app.py::test_ladder_steps_down_to_lighter_then_cache_and_back_up": "the guard on real latencies",
    "test_serve_process.py::test_overload_with_request_start_every_request_has_one_outcome": "overload in real time",
    # beside the serial part at idle CPU priority (scripts/run-tests.sh) these starved: a client's mean 905 ms over
    # the server's, a capacity search whose every step the generator fell behind
    "test_serve_process.py::test_latencylab_load_drives_latencylab_serve": "client and server means reconciled",
    "test_load.py::test_cli_capacity_search_brackets_a_single_worker_server": "a capacity search",
    "test_diagnose_pipelines.py::test_data_path_share_and_the_python_function": "stage shares of real time",
    # its padding cost is a fit of real forward times against lengths: none in a clean-clone CI's part 2
    "test_diagnose_pipelines.py::test_padding_found_without_a_probe": "a cost fitted on real time",
    # its real optimize run must find a significant speed-up (ort-fp32 on passages128: 1.24x on an AVX2 host),
    # which part 2's parallel load hid in a clean-clone CI on that host (session 25)
    "test_serve_from.py::text_best": "a search's significance on real timings",
}


# Serial tests that need the machine idle, not only a core when they wake: their verdict reads how much CPU other
# processes used (diagnose's "busy machine" rule), and idle-priority work is CPU use too. scripts/run-tests.sh
# runs them last in part 1 (nothing else runs then), or, with TEST_OVERLAP=1, after every other test has ended
# (marked ``quiet``; also ``serial``). Same keys as ``SLOW``.
QUIET: dict[str, str] = {
    "test_diagnose_pipelines.py::test_clean_control_gives_no_finding_on_a_quiet_machine": "no false alarm",
    "test_diagnose_pipelines.py::test_a_cycled_input_set_is_no_periodic_finding": "no false alarm",
}


def _named(table: dict[str, str], item: pytest.Item) -> bool:
    module = item.path.name
    names = (getattr(item, "originalname", item.name), *getattr(item, "fixturenames", ()))
    return module in table or any(f"{module}::{n}" in table for n in names)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests ``SLOW`` and ``SERIAL`` name; warn about a name its module no longer defines."""
    seen: dict[str, object] = {}
    for item in items:
        seen[item.path.name] = getattr(item, "module", None)
        if _named(SLOW, item):
            item.add_marker(pytest.mark.slow)
        if _named(QUIET, item):
            item.add_marker(pytest.mark.quiet)
        if _named(SERIAL, item) or _named(QUIET, item) or "machine_noise" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serial)
    # part 2 of scripts/run-tests.sh: every serial test must be in a file part 1 collected (tests/serial_files.py)
    part1 = os.environ.get("LATENCYLAB_PART1_FILES")
    if part1 is not None:
        listed = set(part1.split())
        missed = [i.nodeid for i in items if i.get_closest_marker("serial") and i.nodeid.split("::")[0] not in listed]
        if missed:
            raise pytest.UsageError(f"serial tests in files part 1 did not collect (tests/serial_files.py): {missed}")
    # the quiet ones last (a stable sort): in one part with the other serial tests (scripts/run-tests.sh without
    # overlap), after minutes of light serial work; run first, right after the set-up's installs, their canary saw
    # the machine's speed move 50-60% and they skipped in two clean-clone CI runs (docs/benchmarks/tests.md)
    items.sort(key=lambda item: item.get_closest_marker("quiet") is not None)
    for table, label in ((SLOW, "SLOW"), (SERIAL, "SERIAL"), (QUIET, "QUIET")):
        for key in table:
            module, _, name = key.partition("::")
            if name and module in seen and not hasattr(seen[module], name):
                warnings.warn(f"tests/conftest.py {label} names {key!r}: {module} defines no {name}", stacklevel=1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile``: the longest files first, the Ray modules on one worker (tests/xdist_order.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return xdist_order.make_scheduler(config, log)


_RECORDER = (
    xdist_order.DurationRecorder(Path(os.environ["LATENCYLAB_RECORD_DURATIONS"]))
    if os.environ.get("LATENCYLAB_RECORD_DURATIONS")
    else None
)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With LATENCYLAB_RECORD_DURATIONS=<path>: each file's seconds, for xdist_order's table."""
    if _RECORDER is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        _RECORDER.add(report.nodeid, report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _RECORDER is not None and not os.environ.get("PYTEST_XDIST_WORKER") and _RECORDER.seconds:
        _RECORDER.write()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under xdist, a serial test (set-up, call and tear-down) runs alone; any other shares the machine."""
    with serial_lock.held(exclusive=item.get_closest_marker("serial") is not None):
        yield


STALL_NS = 100_000  # a gap this long between two clock reads of a spinning thread is the scheduler's doing


@dataclass(frozen=True, slots=True)
class Noise:
    """What the scheduler did to this process during a short probe (``Noise.measure()``).

    ``stolen``: share of a spinning thread's wall time lost in gaps of at least ``STALL_NS`` (another
    process, or the hypervisor, had the core). ``max_stall_ms``: the longest such gap. ``wake_late_ms``:
    the second-worst lateness of ``time.sleep(1 ms)`` over 20 sleeps (timer wake-up latency, what an
    event loop's timers suffer). ``load``: the 1-minute load average per CPU, for the record.
    """

    stolen: float
    max_stall_ms: float
    wake_late_ms: float
    load: float
    test: str = ""  # the test that asked (named in the skip reason)

    @classmethod
    def measure(cls, spin_s: float = 0.25, sleeps: int = 20, test: str = "") -> Noise:
        """Spin on ``perf_counter_ns`` for ``spin_s`` counting the gaps, then time ``sleeps`` 1-ms sleeps (~0.3 s)."""
        now = time.perf_counter_ns
        start = last = now()
        end = start + int(spin_s * 1e9)
        stalled = longest = 0
        while last < end:
            t = now()
            gap = t - last
            if gap >= STALL_NS:
                stalled += gap
                longest = max(longest, gap)
            last = t
        late = []
        for _ in range(sleeps):
            t0 = now()
            time.sleep(0.001)
            late.append((now() - t0) / 1e6 - 1.0)
        late.sort()
        return cls(
            stolen=stalled / (last - start),
            max_stall_ms=longest / 1e6,
            wake_late_ms=max(0.0, late[-2]),
            load=os.getloadavg()[0] / (os.cpu_count() or 1),
            test=test,
        )

    def describe(self) -> str:
        return (
            f"{self.stolen:.1%} of a spinning thread's time stolen (longest gap {self.max_stall_ms:.1f} ms), "
            f"1-ms sleeps woke up to {self.wake_late_ms:.1f} ms late, load average {self.load:.2f} per CPU"
        )

    def require(
        self,
        judging: str,
        *,
        stolen: float | None = None,
        max_stall_ms: float | None = None,
        wake_late_ms: float | None = None,
    ) -> None:
        """Skip the calling test, naming ``judging`` and the measured figures, when the machine is noisier than
        the limits given (``stolen``: a fraction; ``max_stall_ms``, ``wake_late_ms``: milliseconds)."""
        over = []
        if stolen is not None and self.stolen > stolen:
            over.append(f"stolen time {self.stolen:.1%} > {stolen:.1%}")
        if max_stall_ms is not None and self.max_stall_ms > max_stall_ms:
            over.append(f"longest stall {self.max_stall_ms:.1f} ms > {max_stall_ms:g} ms")
        if wake_late_ms is not None and self.wake_late_ms > wake_late_ms:
            over.append(f"sleep wake-up lateness {self.wake_late_ms:.1f} ms > {wake_late_ms:g} ms")
        if over:
            who = f"{self.test}: " if self.test else ""
            pytest.skip(f"{who}machine too noisy to judge {judging} ({'; '.join(over)}): {self.describe()}")

    def recheck(self, judging: str, **limits: float) -> None:
        """After a failed judgement: measure again and skip if the machine is now noisier than ``limits`` (it
        turned noisy while the test ran). On a quiet machine this returns and the failure stands."""
        Noise.measure(test=self.test).require(f"{judging} (measured again after the judgement failed)", **limits)


class Watch:
    """How much of a block's wall time the calling thread spent kept off the CPU (``with Watch() as w: ...``).

    ``waited``: the thread's run-queue wait (Linux ``/proc/thread-self/schedstat``: runnable, but another task
    had the core) plus the hypervisor's steal time (``/proc/stat``, the machine's share per CPU), as a fraction
    of the block's wall time. ``None`` where the kernel does not say (then nothing can be set aside by it).
    """

    def __init__(self) -> None:
        self.waited: float | None = None
        self._start: tuple[int, int, int] | None = None

    @staticmethod
    def _read() -> tuple[int, int, int] | None:
        try:
            with open("/proc/thread-self/schedstat") as f:
                wait_ns = int(f.read().split()[1])
            with open("/proc/stat") as f:
                steal_ticks = int(f.readline().split()[8])
        except (OSError, IndexError, ValueError):
            return None
        return wait_ns, steal_ticks, time.perf_counter_ns()

    def __enter__(self) -> Watch:
        self._start = self._read()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        end = self._read()
        if self._start is None or end is None:
            return
        wall = end[2] - self._start[2]
        steal_ns = (end[1] - self._start[1]) * 1e9 / os.sysconf("SC_CLK_TCK") / (os.cpu_count() or 1)
        self.waited = (end[0] - self._start[0] + steal_ns) / wall if wall > 0 else 0.0

    def describe(self) -> str:
        return "unknown" if self.waited is None else f"kept off the CPU {self.waited:.2%} of the time"


@pytest.fixture()
def machine_noise(request: pytest.FixtureRequest) -> Noise:
    """The machine's noise measured just before the test (see ``Noise.require``)."""
    return Noise.measure(test=request.node.name)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never write to the user's cache unless they ask for a specific one."""
    if "LATENCYLAB_CACHE" not in os.environ:
        monkeypatch.setenv("LATENCYLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
