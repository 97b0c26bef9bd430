"""The one plotting module of the reports (run reports and drill reports).

A figure is plain data first (``Figure`` of ``Panel``s of ``Series``, shaded ``Span``s,
``Marker``s and ``VLine``s, every axis labelled with its unit), built by pure functions the
tests check; ``draw`` is the thin matplotlib layer that turns it into a PNG. ``nan`` in a
series breaks its line (progress that falls back to a resumed step, a segment's end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Series", "Span", "Marker", "VLine", "Panel", "Figure", "draw", "spans_decades", "moving_mean", "GAP"]

GAP = math.nan
"""Put between two runs of points of a series: the line breaks there."""


@dataclass(frozen=True)
class Series:
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    style: str = "line"
    """line | steps (held until the next point) | points"""
    color: str | None = None
    marker: str | None = None
    width: float = 1.2
    alpha: float = 1.0
    size: float = 4.0


@dataclass(frozen=True)
class Span:
    """A shaded stretch of the x axis (an outage, a stall)."""

    x0: float
    x1: float
    label: str
    color: str
    alpha: float = 0.15


@dataclass(frozen=True)
class Marker:
    """One point worth naming (a failure, a restore); ``text`` annotates it."""

    x: float
    y: float
    label: str
    color: str
    marker: str = "x"
    text: str = ""
    size: float = 60.0


@dataclass(frozen=True)
class VLine:
    """A moment across the whole panel (a fault fired, a detection)."""

    x: float
    label: str
    color: str
    style: str = "--"
    text: str = ""


@dataclass(frozen=True)
class Panel:
    xlabel: str
    ylabel: str
    series: tuple[Series, ...] = ()
    spans: tuple[Span, ...] = ()
    markers: tuple[Marker, ...] = ()
    vlines: tuple[VLine, ...] = ()
    yscale: str = "linear"
    """linear | log"""
    title: str = ""
    empty_note: str = ""
    """Shown when the panel has nothing to draw."""
    legend: str = "best"

    @property
    def empty(self) -> bool:
        return not (self.series or self.spans or self.markers or self.vlines)


@dataclass(frozen=True)
class Figure:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
    width: float = 10.0
    panel_height: float = 3.4
    share_x: bool = True


def spans_decades(values: Sequence[float]) -> bool:
    """Whether positive values span more than a decade (then a log scale shows them)."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) > 10 * min(positive)


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw_panel(ax: object, panel: Panel) -> None:
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    seen: set[str] = set()

    def once(label: str) -> str | None:  # one legend entry per label
        if not label or label in seen:
            return None
        seen.add(label)
        return label

    for span in panel.spans:
        ax.axvspan(span.x0, span.x1, color=span.color, alpha=span.alpha, label=once(span.label), lw=0)
    for s in panel.series:
        if s.style == "points":
            ax.plot(s.x, s.y, s.marker or "o", ms=s.size, color=s.color, alpha=s.alpha, label=once(s.label), ls="none")
        else:
            ax.plot(
                s.x,
                s.y,
                color=s.color,
                lw=s.width,
                alpha=s.alpha,
                marker=s.marker,
                ms=s.size,
                label=once(s.label),
                drawstyle="steps-post" if s.style == "steps" else "default",
            )
    for v in panel.vlines:
        ax.axvline(v.x, color=v.color, ls=v.style, lw=1.3, label=once(v.label))
        if v.text:
            ax.annotate(
                v.text,
                (v.x, 0),
                xycoords=("data", "axes fraction"),
                xytext=(2, 2),
                textcoords="offset points",
                color=v.color,
                fontsize=8,
            )
    for m in panel.markers:
        ax.scatter([m.x], [m.y], marker=m.marker, color=m.color, s=m.size, label=once(m.label), zorder=3)
        if m.text:
            ax.annotate(m.text, (m.x, m.y), xytext=(4, 4), textcoords="offset points", color=m.color, fontsize=8)
    if panel.yscale == "log":
        ax.set_yscale("log")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.title:
        ax.set_title(panel.title, fontsize=10)
    if panel.empty and panel.empty_note:
        ax.text(0.5, 0.5, panel.empty_note, ha="center", va="center", transform=ax.transAxes)
    if seen:
        ax.legend(loc=panel.legend, fontsize=8)  # type: ignore[call-overload]  # loc: any of matplotlib's names
    ax.grid(alpha=0.25)


def draw(figure: Figure, path: Path, dpi: int = 110) -> Path:
    """Draw ``figure`` into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(figure.panels))
    fig, axes = plt.subplots(
        n, 1, figsize=(figure.width, figure.panel_height * n + 0.6), sharex=figure.share_x, squeeze=False
    )
    for ax, panel in zip(axes[:, 0], figure.panels, strict=False):
        _draw_panel(ax, panel)
    fig.suptitle(figure.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
