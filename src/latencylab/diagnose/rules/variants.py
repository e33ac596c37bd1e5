"""Rules over ``latencylab optimize`` results: an INT8 variant slower than float, a pruned model no faster.

Each variant is compared with the float (FP32) variant of its own backend (``torch-fp32`` for torch
variants, ``ort-fp32`` for ONNX Runtime ones), else with the search's baseline, on p50 latency. *Slower*
means its p50 95% CI lies entirely above the float one's (not an overlap of noise) and the p50 ratio is at
least ``SLOWER``; *no faster* means the pruned variant's p50 speed-up is below ``FASTER`` (5%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latencylab.diagnose.rules.common import of_kind
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

SLOWER = 1.05
FASTER = 1.05
NO_ISA = "this CPU has no int8 dot-product instructions (VNNI/AMX), so int8 kernels emulate them and lose to float; "
INT8_ADVICE = (
    "quantize/dequantize at every layer boundary costs more than the small matmuls save: quantize only the large "
    "matmuls (keep first/last layers and small ops in float), use static quantisation with fused QDQ patterns, "
    "or keep float/bf16 on this machine and quantise on hardware with int8 units"
)
_INT8_ISA = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def _is_int8(c: Mapping[str, Any]) -> bool:
    return "int8" in str(c.get("family", "")) or "int8" in str(c.get("name", ""))


def _reference(c: Mapping[str, Any], cands: Mapping[str, Mapping[str, Any]], baseline: str) -> Mapping[str, Any] | None:
    backend = str(c.get("backend", ""))
    name = "ort-fp32" if backend == "onnxruntime" else "torch-fp32"
    ref = cands.get(name) or cands.get(baseline)
    return ref if ref is not None and ref.get("p50_ms") else None


def _measured(c: Mapping[str, Any]) -> bool:
    return c.get("p50_ms") is not None and c.get("status") not in ("skipped", "failed")


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r in of_kind(results, "optimize"):
        doc = r.doc
        cands = {str(c["name"]): c for c in doc.get("candidates", []) if isinstance(c, Mapping) and "name" in c}
        baseline = str(((doc.get("summary") or {}).get("baseline") or {}).get("name", "torch-fp32"))
        isa = set((doc.get("env") or {}).get("cpu", {}).get("isa") or ())
        slow: list[tuple[float, Mapping[str, Any], Mapping[str, Any]]] = []
        flat: list[tuple[float, Mapping[str, Any], Mapping[str, Any]]] = []
        for c in cands.values():
            if not _measured(c):
                continue
            ref = _reference(c, cands, baseline)
            if ref is None or ref is c:
                continue
            ratio = float(c["p50_ms"]) / float(ref["p50_ms"])
            if _is_int8(c):
                lo = (c.get("p50_ci_ms") or [c["p50_ms"]])[0]
                hi = (ref.get("p50_ci_ms") or [0, ref["p50_ms"]])[-1]
                if ratio >= SLOWER and float(lo) > float(hi):
                    slow.append((ratio, c, ref))
            elif str(c.get("family")) == "prune" and 1 / ratio < FASTER:
                flat.append((ratio, c, ref))
        if slow:
            slow.sort(key=lambda t: -t[0])
            ratio, c, ref = slow[0]
            no_isa = not (isa & set(_INT8_ISA))
            out.append(
                Finding(
                    rule="int8-slower",
                    severity="warning",
                    title=(
                        f"INT8 variant {c['name']} is {ratio:.2f}x slower than float {ref['name']} "
                        f"(p50 {c['p50_ms']:.3f} vs {ref['p50_ms']:.3f} ms)"
                        + (f"; {len(slow) - 1} more INT8 variant(s) too" if len(slow) > 1 else "")
                    ),
                    evidence=(
                        *(
                            Evidence(
                                f"{c2['name']} p50 (vs {r2['name']} {r2['p50_ms']:.3f} ms)",
                                round(c2["p50_ms"], 4),
                                "ms",
                            )
                            for _, c2, r2 in slow
                        ),
                        Evidence("CPU int8 dot-product ISA", ", ".join(sorted(isa & set(_INT8_ISA))) or "none"),
                    ),
                    recommendation=(NO_ISA if no_isa else "") + INT8_ADVICE,
                    source=r.source,
                    details={"slower": [{"name": c2["name"], "ratio": t} for t, c2, _ in slow]},
                )
            )
        if flat:
            flat.sort(key=lambda t: -t[0])
            ratio, c, ref = flat[0]
            out.append(
                Finding(
                    rule="prune-no-faster",
                    severity="warning",
                    title=(
                        f"pruned model {c['name']} is no faster than dense {ref['name']} "
                        f"(p50 {c['p50_ms']:.3f} vs {ref['p50_ms']:.3f} ms, speed-up x{1 / ratio:.2f})"
                    ),
                    evidence=tuple(
                        Evidence(f"{c2['name']} speed-up vs {r2['name']}", round(1 / t, 3), "x") for t, c2, r2 in flat
                    ),
                    recommendation=(
                        "zeros in dense weight tensors are still multiplied by dense kernels: remove whole channels or "
                        "heads (structured pruning) so the tensors shrink, or use block sparsity (4x4 blocks) with a "
                        "sparse-aware runtime, or 2:4 sparsity on GPUs with sparse tensor cores"
                    ),
                    source=r.source,
                    details={"no_faster": [{"name": c2["name"], "speedup": 1 / t} for t, c2, _ in flat]},
                )
            )
    return out
