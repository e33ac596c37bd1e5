"""The roofline: how far a forward pass runs from this machine's compute and memory limits.

theory (ISA x clock peak) / cpuclock (measured core clock) / peaks (microbenchmarked roofs, cached) /
flops (FLOPs and bytes of a forward pass) / model (the roofline arithmetic, RooflinePoint) / api (findings).
Heavy imports (torch) happen inside the functions that need them.
"""

from __future__ import annotations

from latencylab.roofline.model import RooflinePoint, attainable_gflops, place, ridge_point

__all__ = ["RooflinePoint", "attainable_gflops", "place", "ridge_point"]
