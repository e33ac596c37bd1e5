"""What every report figure shares: its size and dpi, the palette, and the PNG as an inline data URI.

PNGs are palette-quantised (Pillow, a matplotlib dependency) so that a report with a dozen figures stays
well under a megabyte and a half. The figure set-up itself (Agg canvas, optional matplotlib, ms labels on
log axes) is :mod:`latencylab.plotting`'s, shared with :mod:`latencylab.load.plots`.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab.plotting import P50, P99, SLO_RED, fmt_ms, new_figure, png_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
WIDE = (11.0, 4.6)  # inches: 1100 x 460 px at DPI

# One colour per meaning, as in load.plots (latencylab.plotting).
DEADLINE = SLO_RED  # red: budgets, SLOs and "over" marks only
CHOSEN = "#2ca02c"
LEVEL = "#1b7837"
STAGE_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#eeca3b", "#9d755d", "#bab0ac")


def new(figsize: tuple[float, float] = WIDE, ncols: int = 1, width_ratios: Sequence[float] | None = None) -> Any:
    """A report figure (:func:`latencylab.plotting.new_figure`), ``WIDE`` unless told."""
    return new_figure(figsize, ncols, width_ratios)


def _png_uri(png: bytes) -> str:
    """Palette-quantised PNG as a data URI (the quantised one only when it is smaller)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    small = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        small, format="PNG", optimize=True
    )
    data = small.getvalue() if small.tell() < len(png) else png
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def to_data_uri(fig: Figure, dpi: int = DPI) -> str:
    """The figure as an inline ``data:image/png;base64,...`` URI."""
    return _png_uri(png_bytes(fig, dpi))


def hist_edges(lo: float, hi: float, bins: int = 60) -> tuple[np.ndarray, bool]:
    """Bin edges (ms): log-spaced when the range spans more than 3x, linear otherwise."""
    lo, hi = max(lo, 1e-6), max(hi, lo * 1.001)
    if hi / lo > 3:
        return np.geomspace(lo, hi * 1.0001, bins + 1), True
    return np.linspace(lo, hi * 1.0001, bins + 1), False


def mark_quantiles(ax: Axes, values: Mapping[str, float], y: float | None = None) -> None:
    for (name, v), color in zip(values.items(), (P50, P99), strict=False):
        ax.axvline(v, color=color, lw=1.2, ls=":")
        ax.annotate(
            f"{name} {fmt_ms(v)} ms", (v, 1.0 if y is None else y), xycoords=("data", "axes fraction"),
            xytext=(3, -12), textcoords="offset points", color=color, fontsize=9, fontweight="bold",
        )  # fmt: skip


def finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
