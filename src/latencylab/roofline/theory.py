"""The CPU's theoretical peak from its ISA and clock: FLOP (or INT8 op) per cycle per core x clock x cores.

Per-cycle throughput is read off the ISA flags and the vendor/family, under stated assumptions (each
:class:`CoreThroughput` carries them as text):

* **FP32**: ``FMA units x (datapath bits / 32) lanes x 2`` (an FMA is two FLOPs). Two FMA units are assumed
  on every x86 core with FMA (Intel Haswell and later client/Gold 6xxx/Platinum; AMD Zen 2 and later); AMD
  Zen 1 has 2 x 128-bit; AMD Zen 4 runs AVX-512 on its 2 x 256-bit pipes (double-pumped), so AVX-512 adds
  no FP32 throughput there; Zen 5 (family 26) and Intel with AVX-512 get 2 x 512-bit. So: AVX-512 Intel =
  64, AVX2 + FMA (Zen 2/3/4, Haswell+) = 32, AVX without FMA = 16 (separate 256-bit add and mul), SSE = 8.
* **INT8** (multiply-accumulates counted as 2 ops): with VNNI (``vpdpbusd``) one instruction does
  ``bits / 8`` u8 x s8 MACs, so ``units x bits / 8 x 2``; without VNNI the AVX2/AVX-512BW sequence is
  ``vpmaddubsw`` + ``vpmaddwd`` (two multiply-pipe uops per ``bits / 8`` MACs): half that. AMX-INT8: 2048.
* **BF16**: ``avx512_bf16`` (``vdpbf16ps``: two BF16 MACs per FP32 lane) = 2 x FP32; AMX-BF16: 1024 per
  core; without either the ISA has no BF16 arithmetic ("none": BF16 is converted to FP32 in software).

The clock is the best one known: cpufreq's ``cpuinfo_max_freq`` (max boost) where the kernel exposes it,
else a measured clock when the caller passes one (:func:`latencylab.roofline.cpuclock.measure_clock_ghz`),
else ``cpu MHz`` from /proc/cpuinfo, which in a VM is the nominal (base) clock and understates a boosting
core. Everything here except :func:`read_cpu` is pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("fp32", "bf16", "int8")


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """What the theory needs about a CPU (all from /proc/cpuinfo and sysfs)."""

    vendor: str  # "AuthenticAMD", "GenuineIntel", ... ("" if unknown)
    family: int | None
    model: int | None
    model_name: str
    flags: frozenset[str]
    cores: int  # CPUs this process may run on (one thread per core assumed; see DESIGN of the peaks)
    clock_ghz: float | None
    clock_source: str  # "cpufreq max", "cpuinfo MHz (nominal)", "measured", "given"

    def to_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "family": self.family,
            "model": self.model,
            "model_name": self.model_name,
            "flags": sorted(self.flags),
            "cores": self.cores,
            "clock_ghz": self.clock_ghz,
            "clock_source": self.clock_source,
        }


@dataclass(frozen=True, slots=True)
class CoreThroughput:
    """Per-core, per-cycle peak by dtype (None = the ISA has no such arithmetic) and how it was derived."""

    fp32: float
    bf16: float | None
    int8: float | None
    isa: Mapping[str, str]  # dtype -> the instruction path assumed, e.g. "AVX2 FMA, 2 x 256-bit"
    assumptions: tuple[str, ...]

    def per_cycle(self, dtype: str) -> float | None:
        return {"fp32": self.fp32, "bf16": self.bf16, "int8": self.int8}[dtype]


@dataclass(frozen=True, slots=True)
class TheoreticalPeak:
    """Peak GFLOP/s (GOP/s for INT8) of one core and of ``cores`` cores at ``clock_ghz``."""

    dtype: str
    per_cycle_per_core: float | None
    clock_ghz: float | None
    cores: int
    isa: str

    def gflops(self, threads: int = 1) -> float | None:
        """Peak for ``threads`` threads (capped at the core count), or None if unsupported or no clock."""
        if self.per_cycle_per_core is None or self.clock_ghz is None:
            return None
        return self.per_cycle_per_core * self.clock_ghz * min(max(threads, 1), self.cores)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "per_cycle_per_core": self.per_cycle_per_core,
            "clock_ghz": self.clock_ghz,
            "cores": self.cores,
            "isa": self.isa,
            "gflops_1": self.gflops(1),
            "gflops_all": self.gflops(self.cores),
        }


@dataclass(frozen=True, slots=True)
class _Datapath:
    bits: int
    units: int
    note: str = ""
    extra: tuple[str, ...] = field(default_factory=tuple)


def _datapath(vendor: str, family: int | None, flags: frozenset[str]) -> _Datapath:
    amd = vendor == "AuthenticAMD"
    if "avx512f" in flags:
        if amd and (family is None or family < 26):
            return _Datapath(256, 2, "AVX-512 on 2 x 256-bit FMA pipes (AMD Zen 4: 512-bit ops double-pumped)")
        return _Datapath(512, 2, "AVX-512, 2 x 512-bit FMA units (assumed; some Xeon Silver/Gold 5xxx have 1)")
    if "fma" in flags and "avx2" in flags:
        if amd and family == 23 and not _zen2(flags):
            return _Datapath(128, 2, "AVX2 FMA on 2 x 128-bit pipes (AMD Zen 1: 256-bit ops split in two)")
        return _Datapath(256, 2, "AVX2 FMA, 2 x 256-bit FMA units (assumed: Haswell+ / Zen 2, 3, 4)")
    if "avx" in flags:
        return _Datapath(256, 1, "AVX without FMA: one 256-bit add + one 256-bit multiply per cycle")
    if "sse2" in flags or "sse" in flags:
        return _Datapath(128, 1, "SSE: one 128-bit add + one 128-bit multiply per cycle")
    return _Datapath(0, 0, "no known SIMD ISA in the flags")


def _zen2(flags: frozenset[str]) -> bool:
    # Zen 2 (family 23, model >= 0x30) has full 256-bit pipes; of the flags, only Zen 2+ have clwb / rdpid /
    # wbnoinvd (Zen 1 lacks them). The model number would do too, but it is masked in some VMs.
    return bool(flags & {"clwb", "rdpid", "wbnoinvd"})


def core_throughput(vendor: str, family: int | None, flags: Iterable[str]) -> CoreThroughput:
    """Per-cycle, per-core FP32 / BF16 / INT8 peak from the vendor, CPU family and ISA flags (pure)."""
    f = frozenset(flags)
    dp = _datapath(vendor, family, f)
    assumptions = [dp.note]
    fma = "fma" in f
    # An FMA is 2 FLOPs per lane; without FMA, one add + one multiply per cycle is also 2 per lane.
    fp32 = float(dp.units * (dp.bits // 32) * 2)
    lanes_bits = dp.bits
    isa = {"fp32": f"{'AVX-512' if 'avx512f' in f else 'AVX2' if 'avx2' in f else 'AVX' if 'avx' in f else 'SSE'}"
           f"{' FMA' if fma else ''}, {dp.units} x {dp.bits}-bit"}  # fmt: skip

    int8: float | None
    if "amx_int8" in f:
        int8 = 2048.0
        isa["int8"] = "AMX-INT8 (2048 ops/cycle/core)"
    elif {"avx512_vnni", "avx_vnni"} & f and dp.bits >= 256:
        bits = lanes_bits if "avx512_vnni" in f else 256
        int8 = float(dp.units * (bits // 8) * 2)
        isa["int8"] = f"VNNI vpdpbusd, {dp.units} x {bits}-bit"
    elif "avx2" in f or "avx512bw" in f:
        bits = lanes_bits if "avx512bw" in f else min(lanes_bits, 256)
        int8 = float(dp.units * (bits // 8) * 2 / 2)
        isa["int8"] = f"vpmaddubsw + vpmaddwd (no VNNI), {dp.units} x {bits}-bit"
        assumptions.append("INT8 without VNNI: 2 multiply-pipe uops per bits/8 MACs (vpmaddubsw + vpmaddwd)")
    else:
        int8 = None
        isa["int8"] = "none"

    bf16: float | None
    if "amx_bf16" in f:
        bf16 = 1024.0
        isa["bf16"] = "AMX-BF16 (1024 FLOP/cycle/core)"
    elif "avx512_bf16" in f:
        bf16 = 2 * fp32
        isa["bf16"] = f"AVX512-BF16 vdpbf16ps, {dp.units} x {dp.bits}-bit"
    else:
        bf16 = None
        isa["bf16"] = "none"
        assumptions.append("no BF16 arithmetic in the ISA: BF16 is emulated (converted to FP32 in software)")
    return CoreThroughput(fp32, bf16, int8, isa, tuple(assumptions))


def theoretical_peaks(cpu: CpuInfo) -> dict[str, TheoreticalPeak]:
    """dtype -> TheoreticalPeak for this CPU (pure)."""
    tp = core_throughput(cpu.vendor, cpu.family, cpu.flags)
    return {d: TheoreticalPeak(d, tp.per_cycle(d), cpu.clock_ghz, cpu.cores, tp.isa[d]) for d in DTYPES}


# ------------------------------------------------------------------------------------------ readers


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as key -> value (pure)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = (p.strip() for p in line.partition(":"))
        out.setdefault(key, value)
    return out


def _int(s: str | None) -> int | None:
    try:
        return int(s or "")
    except ValueError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def choose_clock(
    given: float | None, cpufreq_max: float | None, measured: float | None, nominal: float | None
) -> tuple[float | None, str]:
    """(GHz, source): the given clock, else cpufreq's max, else the measured clock when above the nominal one
    (a boosting core in a VM), else /proc/cpuinfo's nominal MHz (pure)."""
    if given is not None:
        return given, "given"
    if cpufreq_max:
        return cpufreq_max, "cpufreq max"
    if measured is not None and (nominal is None or measured > nominal):
        return measured, "measured"
    return nominal, "cpuinfo MHz (nominal)"


def read_cpu(measured_clock_ghz: float | None = None, clock_ghz: float | None = None) -> CpuInfo:
    """This machine's CpuInfo; ``clock_ghz`` overrides the clock, ``measured_clock_ghz`` is used when cpufreq
    exposes no maximum (and when it is above /proc/cpuinfo's nominal figure)."""
    info = parse_cpuinfo(_read(Path("/proc/cpuinfo")) or "")
    flags = frozenset(info.get("flags", info.get("Features", "")).split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    max_khz = _int(_read(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")))
    mhz = info.get("cpu MHz")
    nominal = float(mhz) / 1000 if mhz and mhz.replace(".", "", 1).isdigit() else None
    clock, source = choose_clock(clock_ghz, max_khz / 1e6 if max_khz else None, measured_clock_ghz, nominal)
    return CpuInfo(
        vendor=info.get("vendor_id", ""),
        family=_int(info.get("cpu family")),
        model=_int(info.get("model")),
        model_name=info.get("model name", info.get("Processor", "")),
        flags=flags,
        cores=cores,
        clock_ghz=clock,
        clock_source=source,
    )
