"""The serve figure: the SLO guard's ladder level over time against the window p99 and the SLO."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latencylab.plotting import P50, P99, log_ms_axis
from latencylab.report.figures.common import DEADLINE, LEVEL, new, to_data_uri


def ladder_over_time(doc: Mapping[str, Any]) -> str:
    """The guard's ladder level over time (step line, top = primary), the window p99 of the current
    level and the SLO (log axis, left), alarm periods in red and each transition's switch time."""
    samples = [s for s in doc.get("samples") or [] if len(s) >= 4]
    ladder = list(doc.get("ladder") or [])
    nlev = max([len(ladder)] + [int(s[1]) + 1 for s in samples])
    names = ladder if len(ladder) == nlev else [f"level {i}" for i in range(nlev)]
    fig, (ax,) = new(figsize=(11.0, 5.4))
    lv = ax.twinx()
    ax.set_zorder(lv.get_zorder() + 1)
    ax.patch.set_visible(False)
    t = [float(s[0]) for s in samples]
    end = float(doc.get("duration_s") or (t[-1] if t else 1.0))
    phases = list(doc.get("phases") or [])
    for i, ph in enumerate(phases):  # benchmarks/serve_ladder.py: when which rungs were slowed on purpose
        stop = float(phases[i + 1]["at_s"]) if i + 1 < len(phases) else end
        if ph.get("slow"):
            first = all(not q.get("slow") for q in phases[:i])
            ax.axvspan(float(ph["at_s"]), stop, color="#fdae61", alpha=0.16, lw=0,
                       label="slowdown injected" if first else None)  # fmt: skip
            ax.text(float(ph["at_s"]) + 0.2, 0.02, "+" + ", ".join(ph["slow"]), transform=ax.get_xaxis_transform(),
                    fontsize=8, color="#a6611a")  # fmt: skip
    lv.step(
        t, [int(s[1]) for s in samples], where="post", color=LEVEL, lw=2.6, alpha=0.85, label="ladder level (right)"
    )
    start = None
    for s in [*samples, [end, 0, None, False]]:
        if s[3] and start is None:
            start = float(s[0])
        elif not s[3] and start is not None:
            lv.axvspan(start, float(s[0]), color=DEADLINE, alpha=0.12, lw=0)
            lv.text(start, -0.55, " ALARM", color=DEADLINE, fontsize=9, fontweight="bold", va="center")
            start = None
    for tr in doc.get("transitions") or []:
        sw = tr.get("switch_time_s")
        if sw is not None and tr.get("t_s") is not None:
            lv.annotate(f"{sw * 1e3:.1f} ms", (float(tr["t_s"]), int(tr["to_level"])), xytext=(4, 4),
                        textcoords="offset points", fontsize=8, color=LEVEL)  # fmt: skip
    lv.set_ylim(nlev - 0.5, -0.8)
    lv.set_yticks(range(nlev), names)
    lv.set_ylabel("ladder level (top = primary)", color=LEVEL)
    qt = [(float(s[0]), float(s[2])) for s in samples if s[2] is not None and s[2] > 0]
    ax.plot([a for a, _ in qt], [b for _, b in qt], color=P50, lw=1.5, label="guard: window p99 of the current level")
    per_s = [w for w in doc.get("client_per_second") or [] if w.get("p99_ms") is not None]
    shift = float(doc.get("client_shift_s") or 0.0)
    if per_s:
        ax.step([w["from_s"] + shift for w in per_s], [w["p99_ms"] for w in per_s], where="post", color=P99, lw=1.4,
                label="client p99 per second (open loop)")  # fmt: skip
    slo = doc.get("slo_ms")
    if slo is not None:
        ax.axhline(float(slo), color=DEADLINE, ls="--", lw=1.3, label=f"SLO p99 <= {float(slo):g} ms")
    ax.set_yscale("log")
    log_ms_axis(ax.yaxis)
    ax.set_ylabel("latency (ms, log)")
    ax.set_xlabel("seconds since the start of the load")
    ax.set_xlim(0, end)
    ax.grid(True, alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = lv.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncols=3, fontsize=8.5, frameon=False)
    fig.suptitle(f"SLO guard ladder over time: {doc.get('model', '')} model, {doc.get('rate', '?')} req/s", fontsize=13)
    return to_data_uri(fig)
