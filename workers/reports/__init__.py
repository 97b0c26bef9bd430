"""Everything Cairn shows as a report: ``run`` (a run's PNG plots and summary), ``timeline``
(a workflow history as a timeline of events), ``drill`` (a drill's table, JSON and timeline)."""
