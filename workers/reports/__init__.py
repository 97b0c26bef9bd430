"""Everything Cairn shows as a report: ``run`` (a run's PNG plots and summary), ``timeline``
(a workflow history as a timeline of events), ``faults`` (each lost attempt placed in time: its
last sign of life, detector, stall and recomputed steps), ``drill`` (a drill's table, JSON and
timeline)."""
