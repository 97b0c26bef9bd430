"""The one plotting module of the reports (run reports and drill reports).

A figure is plain data first (``Figure`` of ``Panel``s of ``Series``, shaded ``Span``s,
``Marker``s and ``VLine``s, every axis labelled with its unit, and notes under the panels),
built by pure functions the tests check; ``render`` is the thin matplotlib layer that lays it
out (long titles and notes wrapped to the figure's width, never cut) and ``draw`` saves it as a
PNG. ``nan`` in a series breaks its line (progress that falls back to a resumed step).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.errors import MissingExtraError

if TYPE_CHECKING:
    import matplotlib.figure

__all__ = [
    "require_plots",
    "Series",
    "Span",
    "Marker",
    "VLine",
    "Panel",
    "Figure",
    "render",
    "draw",
    "spans_decades",
    "moving_mean",
    "GAP",
]

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
    notes: tuple[str, ...] = ()
    """Lines under the panels (what each numbered marker stands for), whole."""


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


TITLE_SIZE = 11.0
NOTE_SIZE = 8.0
_EM_PER_CHAR = 0.62
"""Average width of a character of the default font in ems (DejaVu Sans runs wide): text wrapped
to ``width / (size * this)`` characters fits the figure."""


def _wrapped(lines: Sequence[str], width_in: float, size: float) -> list[str]:
    """Each line wrapped to fit ``width_in`` inches at ``size`` points; no word is cut."""
    chars = max(20, int(width_in * 72 / (size * _EM_PER_CHAR)))
    out: list[str] = []
    for line in lines:
        wrapped = textwrap.wrap(line, chars, break_long_words=False, break_on_hyphens=False, subsequent_indent="   ")
        out += wrapped or [""]
    return out


def require_plots(needed_by: str = "drawing PNG plots") -> None:
    """Refuse at once, in one line naming the ``report`` extra, where matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("matplotlib", "report", needed_by) from None


def render(figure: Figure) -> matplotlib.figure.Figure:
    """``figure`` laid out by matplotlib (Agg): one axes per panel, then the notes, wrapped."""
    require_plots()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(figure.panels))
    text_width = figure.width - 0.4
    notes = _wrapped(figure.notes, text_width, NOTE_SIZE)
    notes_height = (len(notes) * NOTE_SIZE * 1.45 / 72 + 0.15) if notes else 0.0
    title = _wrapped(figure.title.split("\n"), text_width, TITLE_SIZE)
    title_height = len(title) * TITLE_SIZE * 1.5 / 72
    fig = plt.figure(figsize=(figure.width, figure.panel_height * n + title_height + notes_height + 0.3))
    ratios = [figure.panel_height] * n + ([notes_height] if notes else [])
    grid = fig.add_gridspec(len(ratios), 1, height_ratios=ratios)
    first = None
    for i in range(n):
        ax = fig.add_subplot(grid[i, 0], sharex=first if figure.share_x else None)
        first = first or ax
        if i < len(figure.panels):
            _draw_panel(ax, figure.panels[i])
    if notes:
        ax = fig.add_subplot(grid[n, 0])
        ax.axis("off")
        ax.text(0.0, 1.0, "\n".join(notes), va="top", ha="left", fontsize=NOTE_SIZE, transform=ax.transAxes)
    fig.suptitle("\n".join(title), fontsize=TITLE_SIZE)
    fig.tight_layout()
    return fig


def draw(figure: Figure, path: Path, dpi: int = 110) -> Path:
    """Draw ``figure`` into a PNG at ``path``."""
    require_plots()
    import matplotlib.pyplot as plt

    fig = render(figure)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
