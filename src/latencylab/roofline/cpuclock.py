"""Measure the core clock a busy thread really runs at (x86-64 Linux), for VMs that hide cpufreq.

In a KVM guest /proc/cpuinfo's ``cpu MHz`` is the nominal (TSC) clock and sysfs has no cpufreq directory,
so a boosting core looks slower than it is, and measured GEMM throughput can exceed a "theoretical" peak
computed from that figure. This module times a loop whose cycle count is known exactly: 16 dependent
register adds (``add rax, rdx``: 1-cycle latency on every x86-64 core since the P6, and not eliminated at
rename the way some cores fold ``add reg, imm``) per iteration, so each iteration takes 16 cycles and the
clock is ``16 x iterations / seconds``. The machine code is put in an anonymous executable mapping and
called through ctypes; where that is impossible (another architecture, W^X policy) the answer is None.

It measures the clock of integer code; cores that lower their clock for wide vector code (Intel AVX-512
licence levels) run GEMMs slower than this, so a peak from it is an upper bound, as a peak should be.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import platform
import time

_ADDS = 16
# rdi = iterations; returns rax (= 16 x iterations, which also proves the loop ran).
_CODE = (
    b"\x31\xc0"  # xor eax, eax
    + b"\xba\x01\x00\x00\x00"  # mov edx, 1
    + b"\x48\x01\xd0" * _ADDS  # loop: add rax, rdx (x16)
    + b"\x48\xff\xcf"  # dec rdi
    + b"\x75"
    + bytes([256 - (3 * _ADDS + 3 + 2)])  # jnz loop
    + b"\xc3"  # ret
)


def measure_clock_ghz(iterations: int = 300_000, repeats: int = 60) -> float | None:
    """The best-of-``repeats`` clock in GHz of the calling thread's core, or None where it cannot run.

    Many short repeats (300k iterations: ~1.5 ms at 3 GHz), not a few long ones: on a busy machine the scheduler
    takes the core away for milliseconds at a time, so every 25-ms repeat lost some of its time to another
    process (measured: 1.9 GHz for a core that runs at 3.2 with load 6 on 2 CPUs), while among 60 short ones some
    run whole. The best one is the clock."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not hasattr(mmap, "PROT_EXEC"):
        return None
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    try:
        buf.write(_CODE)
        cell = ctypes.c_char.from_buffer(buf)
        fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(ctypes.addressof(cell))
        if fn(10) != 10 * _ADDS:
            return None
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(iterations)
            best = min(best, time.perf_counter() - t0)
        del fn, cell
    finally:
        with contextlib.suppress(BufferError):  # a ctypes view still alive (early error): left to the GC
            buf.close()
    return _ADDS * iterations / best / 1e9
