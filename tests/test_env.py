"""Environment fingerprint, lint, diff and loading: on this real machine and on hand-built dicts."""

from __future__ import annotations

import copy
import json
import os
import platform
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from latencylab import env
from latencylab.errors import LatencyLabError


def clean_fp() -> dict[str, Any]:
    """A fingerprint of a well-prepared bare-metal box: lint must find nothing wrong with it."""
    return {
        "fingerprint_version": 1,
        "created_at": "2026-01-01T00:00:00+00:00",
        "cpu": {
            "model": "Intel(R) Xeon(R) Platinum 8480+",
            "logical_cpus": 8,
            "physical_cores": 8,
            "smt": False,
            "isa": ["amx_bf16", "avx2", "avx512f"],
            "governor": "performance",
            "frequency": {"cur_mhz": 2000, "min_mhz": 2000, "max_mhz": 2000, "turbo": False},
            "affinity": 8,
        },
        "memory": {"total_bytes": 64 * 2**30, "available_bytes": 60 * 2**30},
        "load": {"loadavg_1": 0.1, "loadavg_5": 0.2, "loadavg_15": 0.2, "cpu_percent": 1.5},
        "os": {"system": "Linux", "release": "6.8.0", "machine": "x86_64", "distro": "Ubuntu 24.04"},
        "python": {
            "version": "3.11.7",
            "implementation": "CPython",
            "debug_build": False,
            "executable": "/a",
        },
        "libraries": {"torch": "2.13.0", "onnxruntime": "1.32.0", "numpy": "2.4.6"},
        "threads": {
            "env": {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": None, "OPENBLAS_CORETYPE": "SAPPHIRERAPIDS"},
            "torch_intra_op": 8,
            "torch_inter_op": 1,
        },
        "gpu": None,
        "process": {"debugger": False, "coverage": False, "pid": 123},
    }


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    fp = copy.deepcopy(clean_fp())
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = fp
        for key in parents:
            node = node[key]
        node[leaf] = value
    return fp


def codes(fp: dict[str, Any]) -> list[str]:
    return [w.code for w in env.lint(fp)]


# ------------------------------------------------------------------------------ fingerprint (this machine)
@pytest.fixture(scope="module")
def fp() -> dict[str, Any]:
    return env.fingerprint(sample_s=0.05)


def test_fingerprint_types_and_json_round_trip(fp: dict[str, Any]) -> None:
    assert fp["fingerprint_version"] == 1
    assert fp["created_at"].endswith("+00:00")
    assert json.loads(json.dumps(fp)) == fp
    cpu = fp["cpu"]
    assert cpu["logical_cpus"] == os.cpu_count()
    assert cpu["affinity"] == len(os.sched_getaffinity(0))
    assert cpu["smt"] in (True, False, None)
    assert cpu["isa"] == sorted(cpu["isa"]) and set(cpu["isa"]) <= env._ISA_FLAGS
    assert isinstance(fp["memory"]["total_bytes"], int)
    assert 0 < fp["memory"]["available_bytes"] <= fp["memory"]["total_bytes"]
    assert all(isinstance(fp["load"][k], float) for k in ("loadavg_1", "loadavg_5", "loadavg_15"))
    assert 0.0 <= fp["load"]["cpu_percent"] <= 100.0
    assert fp["os"]["release"] == platform.release() and fp["os"]["machine"] == platform.machine()
    assert fp["python"]["version"] == platform.python_version()
    assert fp["python"]["debug_build"] is hasattr(sys, "gettotalrefcount")
    assert fp["process"] == {"debugger": False, "coverage": fp["process"]["coverage"], "pid": os.getpid()}


def test_cpu_readings_match_proc_and_sys(fp: dict[str, Any]) -> None:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":")[1].split()
    assert set(fp["cpu"]["isa"]) == set(flags) & env._ISA_FLAGS
    assert ("avx2" in fp["cpu"]["isa"]) == ("avx2" in flags)
    assert (fp["os"]["virtualization"] is not None) == ("hypervisor" in flags)
    governors = {p.read_text().strip() for p in Path("/sys/devices/system/cpu").glob("cpu*/cpufreq/scaling_governor")}
    assert fp["cpu"]["governor"] == (",".join(sorted(governors)) if governors else "not exposed")
    if not governors:  # e.g. this VM: no cpufreq, so lint can only say it could not check
        assert "governor-unknown" in codes(fp) and "governor" not in codes(fp)


def test_library_versions_come_from_metadata_without_importing_torch() -> None:
    code = (
        "import sys, json; from latencylab import env; fp = env.fingerprint(sample_s=0); "
        "print(json.dumps(['torch' in sys.modules, fp['libraries'], fp['threads']['torch_intra_op']]))"
    )
    src = str(Path(env.__file__).parents[1])  # works whether or not latencylab is pip-installed
    pythonpath = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    child_env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env)
    torch_imported, libraries, intra = json.loads(out.stdout)
    assert torch_imported is False and intra is None
    import numpy

    import latencylab

    assert libraries["numpy"] == numpy.__version__
    assert libraries["latencylab"] == latencylab.__version__
    assert set(libraries) == set(env._LIBRARIES)


def test_probe_torch_reads_torch_threads() -> None:
    torch = pytest.importorskip("torch")
    fp = env.fingerprint(sample_s=0, probe_torch=True)
    assert fp["threads"]["torch_intra_op"] == torch.get_num_threads()
    assert fp["threads"]["torch_inter_op"] == torch.get_num_interop_threads()
    assert fp["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["libraries"]["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert fp["gpu"] is None or fp["gpu"]["torch"] is None


def test_thread_env_var_oversubscription_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", str(cpus * 4))
    monkeypatch.setenv("OPENBLAS_CORETYPE", "ZEN")  # not a count: must not confuse the check
    fp = env.fingerprint(sample_s=0)
    assert fp["threads"]["env"]["OMP_NUM_THREADS"] == str(cpus * 4)
    warning = next(w for w in env.lint(fp) if w.code == "oversubscription")
    assert f"OMP_NUM_THREADS={cpus * 4} > {cpus} usable CPUs" in warning.message
    monkeypatch.setenv("OMP_NUM_THREADS", str(cpus))
    assert not any("OMP_NUM_THREADS" in w.message for w in env.lint(env.fingerprint(sample_s=0)))


def test_trace_function_reads_as_debugger() -> None:
    previous = sys.gettrace()
    sys.settrace(lambda *args: None)
    try:
        fp = env.fingerprint(sample_s=0)
    finally:
        sys.settrace(previous)
    assert fp["process"]["debugger"] is True
    assert "debugger" in codes(fp)


def test_nvml_fields_tolerate_not_supported_and_old_bytes_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU or pynvml on the test machines, so a stand-in module with NVML's calling convention is used.
    class NotSupported(Exception):
        pass

    def not_supported(*args: Any) -> Any:
        raise NotSupported

    calls: list[str] = []
    nv = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",  # pynvml < 11.5 returns bytes
        nvmlDeviceGetClockInfo=lambda h, c: {1: 345, 2: 2619}[c],
        nvmlDeviceGetMaxClockInfo=lambda h, c: {1: 1980, 2: 3201}[c],
        nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
        nvmlDeviceGetPersistenceMode=not_supported,
        nvmlSystemGetDriverVersion=lambda: "570.86.15",
    )
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpu = env.fingerprint(sample_s=0)["gpu"]
    assert gpu["nvml"] == {
        "driver_version": "570.86.15",
        "devices": [
            {
                "name": "NVIDIA H200",
                "sm_clock_mhz": 345,
                "sm_max_clock_mhz": 1980,
                "mem_clock_mhz": 2619,
                "mem_max_clock_mhz": 3201,
                "power_limit_w": 700.0,
                "persistence_mode": None,
            }
        ],
    }
    assert calls == ["init", "shutdown"]
    monkeypatch.setattr(nv, "nvmlInit", not_supported)  # driver not loaded
    assert (env.fingerprint(sample_s=0)["gpu"] or {}).get("nvml") is None


# ------------------------------------------------------------------------------------------------ lint
def test_clean_fingerprint_has_no_warnings() -> None:
    assert env.lint(clean_fp()) == []


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"cpu.governor": "powersave"}, "governor"),
        ({"cpu.governor": "not exposed"}, "governor-unknown"),
        ({"load.loadavg_1": 4.5}, "busy"),
        ({"load.cpu_percent": 31.0}, "busy"),
        ({"threads.env.MKL_NUM_THREADS": "16"}, "oversubscription"),
        ({"threads.torch_intra_op": 9}, "oversubscription"),
        ({"cpu.frequency.turbo": True}, "turbo"),
        ({"cpu.frequency.min_mhz": 800}, "turbo"),
        ({"process.debugger": True}, "debugger"),
        ({"process.coverage": True}, "coverage"),
        ({"python.debug_build": True}, "debug-build"),
        ({"cpu.smt": True}, "smt"),
    ],
)
def test_each_problem_gives_exactly_its_warning(changes: dict[str, Any], code: str) -> None:
    warnings = env.lint(with_changes(changes))
    assert [w.code for w in warnings] == [code]
    assert warnings[0].message and warnings[0].hint


def test_busy_message_says_the_numbers() -> None:
    (warning,) = env.lint(with_changes({"load.loadavg_1": 4.5, "load.cpu_percent": 42.0}))
    assert "4.5" in warning.message and "8 CPUs" in warning.message and "42.0%" in warning.message


def test_oversubscription_uses_the_affinity_mask_not_all_cpus() -> None:
    (warning,) = env.lint(with_changes({"cpu.affinity": 2, "threads.torch_intra_op": 2}))
    assert warning.code == "oversubscription"
    assert "OMP_NUM_THREADS=8 > 2 usable CPUs" in warning.message


def test_lint_tolerates_sparse_and_foreign_dicts() -> None:
    assert codes({}) == ["governor-unknown"]
    assert "oversubscription" not in codes(with_changes({"threads.env.OMP_NUM_THREADS": "lots"}))


# ------------------------------------------------------------------------------------------------ diff
def test_diff_finds_torch_and_thread_changes_and_ignores_volatile_fields() -> None:
    a = clean_fp()
    b = with_changes(
        {
            "libraries.torch": "2.12.0",
            "threads.env.OMP_NUM_THREADS": "4",
            "load.loadavg_1": 7.0,
            "load.cpu_percent": 99.0,
            "created_at": "2027-01-01T00:00:00+00:00",
            "process.pid": 999,
            "memory.available_bytes": 1,
            "cpu.frequency.cur_mhz": 3500,
            "python.executable": "/b",
        }
    )
    assert env.diff(a, b) == [
        env.EnvDifference("libraries.torch", "2.13.0", "2.12.0", "high"),
        env.EnvDifference("threads.env.OMP_NUM_THREADS", "8", "4", "high"),
    ]
    assert env.diff(a, copy.deepcopy(a)) == []


def test_diff_impact_levels() -> None:
    b = with_changes(
        {
            "python.version": "3.11.9",  # patch: low
            "os.release": "6.9.0",
            "libraries.numpy": "2.0.0",
            "cpu.governor": "powersave",
            "cpu.isa": ["avx2"],
            "memory.total_bytes": 32 * 2**30,
        }
    )
    b["libraries"]["onnx"] = "1.23.2"  # installed on one side only
    got = {d.path: d.impact for d in env.diff(clean_fp(), b)}
    assert got == {
        "cpu.isa": "high",
        "cpu.governor": "medium",
        "os.release": "medium",
        "libraries.numpy": "medium",
        "libraries.onnx": "medium",
        "python.version": "low",
        "memory.total_bytes": "low",
    }
    assert env.diff(clean_fp(), with_changes({"python.version": "3.12.1"}))[0].impact == "high"
    paths = [d.path for d in env.diff(clean_fp(), b)]
    assert paths[0] == "cpu.isa" and paths[-2:] == ["memory.total_bytes", "python.version"]


def test_diff_gpu_fields_but_not_live_clocks() -> None:
    def gpu(sm_clock: int, driver: str) -> dict[str, Any]:
        dev = {"name": "NVIDIA H200", "sm_clock_mhz": sm_clock, "sm_max_clock_mhz": 1980}
        return {"torch": None, "nvml": {"driver_version": driver, "devices": [dev]}}

    a, b = with_changes({"gpu": gpu(345, "570.1")}), with_changes({"gpu": gpu(1980, "570.2")})
    assert env.diff(a, b) == [env.EnvDifference("gpu.nvml.driver_version", "570.1", "570.2", "high")]
    appeared = env.diff(clean_fp(), a)  # a GPU on one side only: every stable field, all high
    assert [(d.path, d.a, d.impact) for d in appeared] == [
        ("gpu.nvml.devices.0.name", None, "high"),
        ("gpu.nvml.devices.0.sm_max_clock_mhz", None, "high"),
        ("gpu.nvml.driver_version", None, "high"),
    ]


def test_diff_skips_torch_readings_taken_on_one_side_only() -> None:
    unprobed = with_changes({"threads.torch_intra_op": None, "threads.torch_inter_op": None})
    assert env.diff(unprobed, clean_fp()) == []


# ---------------------------------------------------------------------------------------------- loading
def test_load_bare_fingerprint_and_result_file(tmp_path: Path, fp: dict[str, Any]) -> None:
    bare = tmp_path / "env.json"
    bare.write_text(json.dumps(fp))
    assert env.load_fingerprint(bare) == fp
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"schema_version": 1, "env": fp, "samples_ns": [1, 2, 3]}))
    assert env.load_fingerprint(str(result)) == fp


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "is not valid JSON"),
        (json.dumps({"schema_version": 1, "samples_ns": [1]}), "holds no environment fingerprint"),
        (json.dumps({"schema_version": 1, "env": None}), "holds no environment fingerprint"),
        (json.dumps([1, 2]), "holds no environment fingerprint"),
    ],
)
def test_load_fingerprint_errors_are_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LatencyLabError, match=message) as info:
        env.load_fingerprint(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


# ---------------------------------------------------------------------------------------------- render
def render(func: Any, value: Any) -> str:
    console = Console(record=True, width=200, color_system=None)
    func(value, console)
    return console.export_text()


def test_render_tables(fp: dict[str, Any]) -> None:
    text = render(env.render_fingerprint, fp)
    assert fp["cpu"]["governor"] in text and fp["python"]["version"] in text and "[bold]" not in text
    text = render(env.render_warnings, env.lint(with_changes({"cpu.governor": "powersave"})))
    assert "governor" in text and "cpupower frequency-set -g performance" in text
    assert render(env.render_warnings, []).strip() == "no environment warnings"
    diffs = env.diff(clean_fp(), with_changes({"libraries.torch": "2.12.0[cu]"}))
    text = render(env.render_diff, diffs)
    assert "libraries.torch" in text and "2.12.0[cu]" in text and "high" in text
    assert render(env.render_diff, []).strip() == "no differences that affect latency"


def test_torch_default_inter_op_threads_are_not_a_false_alarm() -> None:
    fp = {
        "cpu": {"logical_cpus": 2, "affinity": 2, "governor": "performance"},
        "threads": {"torch_intra_op": 2, "torch_inter_op": 2, "env": {}},
    }
    assert "oversubscription" not in codes(fp)
