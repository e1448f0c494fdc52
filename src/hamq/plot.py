"""Time-series plots (PNG) for benches, the chaos suite and ``bench/RESULTS.md``: one look
at a run shows throughput and latency over time and where a kill or an election happened,
which a single summary number hides.

matplotlib is imported inside :func:`plot_series` only, so commands that never plot (every
CLI start) do not pay for it; its ``Figure`` with the Agg canvas needs no display and leaves
pyplot's global state alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PANEL_HEIGHT_IN = 2.6
FIGURE_WIDTH_IN = 10.0
DPI = 110  # about 1100 px wide: readable in a GitHub page without zooming
EVENT_COLOURS = ("#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


@dataclass
class Panel:
    """One y axis: named series of (seconds since start, value), and the events (seconds,
    label) marked on it by a labelled vertical line."""

    ylabel: str
    series: dict[str, list[tuple[float, float]]]
    events: list[tuple[float, str]] = field(default_factory=list)


def plot_series(path: str | Path, title: str, panels: list[Panel]) -> None:
    """Panels stacked over one shared time axis (seconds), written to ``path`` as PNG."""
    if not panels:
        raise ValueError("plot_series needs at least one panel")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    thousands = FuncFormatter(lambda y, _: f"{y:,g}")  # 250,000 msgs/s, 0.5 ms

    fig = Figure(figsize=(FIGURE_WIDTH_IN, 0.8 + PANEL_HEIGHT_IN * len(panels)), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    colour_of = _event_colours(panels)
    span = max(
        [x for p in panels for points in p.series.values() for x, _ in points]
        + [at for p in panels for at, _ in p.events]
        + [1.0]
    )
    for ax, panel in zip(axes, panels, strict=True):
        for name, points in panel.series.items():
            xs = [x for x, _ in points]
            ys = [y for _, y in points]
            ax.plot(xs, ys, label=name, linewidth=1.4, marker="." if len(points) < 40 else None)
        for (at, label), left in zip(panel.events, _label_sides(panel.events, span), strict=True):
            ax.axvline(at, color=colour_of[label], linestyle="--", linewidth=1.1)
            # rotated, from the axes' top: many kills stay readable side by side
            ax.annotate(
                label,
                xy=(at, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3 if left else 3, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                ha="right" if left else "left",
                fontsize=8,
                color=colour_of[label],
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
            )
        ax.set_ylabel(panel.ylabel)
        ax.yaxis.set_major_formatter(thousands)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if panel.series:
            ax.legend(loc="upper right", fontsize=8, framealpha=0.8)
    axes[-1].set_xlabel("time (s)")
    axes[-1].set_xlim(left=0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(Path(path), format="png")


def _event_colours(panels: list[Panel]) -> dict[str, str]:
    """The same label has the same colour on every panel (a kill is always red)."""
    labels = list(dict.fromkeys(label for p in panels for _, label in p.events))
    return {label: EVENT_COLOURS[i % len(EVENT_COLOURS)] for i, label in enumerate(labels)}


def _label_sides(events: list[tuple[float, str]], span: float) -> list[bool]:
    """For each event, whether its label goes left of its line: of two events close
    together (in 2% of the time axis) the earlier one's label goes left and the later
    one's right, so they do not overlap."""
    near = 0.02 * span
    order = sorted(range(len(events)), key=lambda i: events[i][0])
    ats = [events[i][0] for i in order]
    left = [False] * len(events)
    for n, i in enumerate(order):
        next_close = n + 1 < len(ats) and ats[n + 1] - ats[n] < near
        previous_close = n > 0 and ats[n] - ats[n - 1] < near
        left[i] = next_close and not previous_close
    return left
