"""The PNGs never cut a label: every text a report draws (titles, axis labels, legends, the
notes telling each fault in full) is whole, and lies inside the figure, as matplotlib lays it
out (its text objects, not pixels)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.text import Text

from tests.unit.workers.reports.test_fault_reports import supervised_crash
from workers.reports.figures import loss_figure, throughput_figure, timeline_figure
from workers.reports.plots import Figure, render


def texts(figure: Figure) -> list[tuple[str, bool]]:
    """Each visible text of ``figure`` as drawn (tick numbers aside: matplotlib's own), and
    whether it lies inside the figure."""
    fig = render(figure)
    try:
        fig.canvas.draw()  # lays out the legends
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        box = fig.bbox
        ticks = {
            label
            for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks()
            for label in (tick.label1, tick.label2)
        }
        out = []
        for t in fig.findobj(Text):
            if t in ticks or not t.get_visible() or not t.get_text().strip():
                continue
            extent = t.get_window_extent(renderer)
            inside = extent.x0 >= box.x0 - 0.5 and extent.x1 <= box.x1 + 0.5
            inside = inside and extent.y0 >= box.y0 - 0.5 and extent.y1 <= box.y1 + 0.5
            out.append((t.get_text(), inside))
        return out
    finally:
        plt.close(fig)


def test_the_timeline_tells_each_fault_whole_inside_the_figure() -> None:
    figure = timeline_figure(supervised_crash())
    drawn = texts(figure)
    assert all(inside for _, inside in drawn), [t for t, inside in drawn if not inside]
    joined = " ".join(" ".join(t.split()) for t, _ in drawn)
    assert figure.notes and all(" ".join(note.split()) in joined for note in figure.notes), figure.notes
    message = "its supervisor failed the attempt so that it is retried now"
    assert message in joined  # the failure's own words, not its first 40 characters
    (panel,) = figure.panels
    labels = [s.label for s in panel.series] + [s.label for s in panel.spans]
    labels += [m.label for m in panel.markers] + [v.label for v in panel.vlines]
    assert (
        "fault: last heartbeat (estimated)" in labels
        and "detected by its supervisor (the worker process died)" in labels
    )
    assert all(label in joined for label in labels), labels  # every legend entry whole


def test_every_report_figure_keeps_its_texts_inside() -> None:
    rec = supervised_crash()
    for figure in (throughput_figure(rec), loss_figure(rec)):
        drawn = texts(figure)
        assert drawn and all(inside for _, inside in drawn), [t for t, inside in drawn if not inside]
        for line in figure.title.split("\n"):
            assert " ".join(line.split()) in " ".join(" ".join(t.split()) for t, _ in drawn)
