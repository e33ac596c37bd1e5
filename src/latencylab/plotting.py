"""The plot set-up every figure shares: an Agg figure (never pyplot), PNG bytes, ms labels, colours.

matplotlib is optional (``pip install 'latencylab[plot]'``) and imported only when a figure is made;
a missing one is a one-line :class:`~latencylab.errors.LatencyLabError`. Figures are built on the Agg
canvas directly, never through pyplot, so plotting neither needs a display nor changes the backend of
the process that calls it (a notebook keeps its own). Used by :mod:`latencylab.load.plots` (PNG files)
and :mod:`latencylab.report.figures` (inline data URIs).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latencylab.errors import require

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["P50", "P99", "SLO_RED", "fmt_ms", "log_ms_axis", "new_figure", "png_bytes", "save_png"]

# One colour per meaning, the same in every figure.
P50 = "#1f77b4"  # blue
P99 = "#ff7f0e"  # orange
SLO_RED = "#d62728"  # red: budgets, SLOs, deadlines and "over" marks only


def new_figure(
    figsize: tuple[float, float], ncols: int = 1, width_ratios: Sequence[float] | None = None
) -> tuple[Figure, list[Axes]]:
    """A constrained-layout figure on its own Agg canvas and its ``ncols`` axes in one row."""
    require("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False, width_ratios=width_ratios)[0]
    return fig, list(axes)


def png_bytes(fig: Figure, dpi: int) -> bytes:
    """The figure as PNG bytes: exactly ``figsize * dpi`` pixels (no ``bbox_inches="tight"``)."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path, dpi: int) -> Path:
    """Write the figure as a PNG file (its folder made if missing) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # No bbox_inches="tight": the image is exactly figsize * dpi, whatever the labels.
    fig.savefig(p, dpi=dpi, format="png")
    return p


def fmt_ms(v: float) -> str:
    """A latency in ms for a label: 1,234 above 100, three significant digits below."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def log_ms_axis(axis: Any) -> None:
    """Plain-number labels on a log axis (1, 10, 100); 2x and 5x ticks labelled too when it spans
    under two decades. ``axis``: ``ax.xaxis`` or ``ax.yaxis``."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def major(v: float, _pos: int | None) -> str:
        return f"{v:g}"

    def minor(v: float, _pos: int | None) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if lo <= 0 or math.log10(hi / lo) > 2:
            return ""
        return f"{v:g}"

    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(major))
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(FuncFormatter(minor))
