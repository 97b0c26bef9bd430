"""The metrics reference page, read from Cairn's Prometheus registry (``activities.metrics``):
every metric's exposed series, type, labels and help."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from workers.reference.markdown import table

__all__ = ["page", "rows"]

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def rows(registry: CollectorRegistry | None = None) -> list[tuple[str, str, str, str]]:
    """Each metric of ``registry`` (default: Cairn's): series, type, labels, help."""
    if registry is None:
        from activities.metrics import REGISTRY

        registry = REGISTRY
    found = []
    for collector in registry._collector_to_names:  # the registry's own record of its collectors
        for family in collector.describe():
            labels = ", ".join(f"`{name}`" for name in getattr(collector, "_labelnames", ())) or "-"
            series = ", ".join(f"`{family.name}{suffix}`" for suffix in _SUFFIXES.get(family.type, ("",)))
            found.append((series, family.type, labels, family.documentation))
    return sorted(found)


def page() -> str:
    from workers.metrics import DEFAULT_METRICS_PORT

    out = [
        "# Metrics",
        "",
        f"Every worker serves Prometheus metrics on `:{DEFAULT_METRICS_PORT}/metrics` (`CAIRN_METRICS_PORT`,",
        "`cairn worker --metrics-port`): Cairn's own, listed here from its registry, and the Temporal SDK's",
        "runtime metrics (`temporal_*`: task slots, poll latency, activity and workflow task outcomes) on the",
        "same endpoint. Labels stay low-cardinality (no run ids): per-run detail is in the logs and",
        "`cairn run report`. [Operating workers](../how-to/operating.md) shows what to watch.",
        "",
        table(("series", "type", "labels", "meaning"), rows()),
    ]
    return "\n".join(out) + "\n"
