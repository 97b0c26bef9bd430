"""The worker's Prometheus endpoint: Cairn's metrics and the Temporal SDK's runtime metrics, one
scrape target (``CAIRN_METRICS_PORT``, default 9464, path ``/metrics``).

The SDK's core exports its metrics (workflow/activity task latencies, poller counts, sticky
cache, ...) in Prometheus format on an internal loopback port; a collector re-exposes them
here at scrape time, next to ``activities.metrics``, through the ``prometheus-client`` library.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.metrics import REGISTRY
from workers.stack.servers import free_port

__all__ = ["DEFAULT_METRICS_PORT", "MetricsEndpoint", "serve_metrics"]

DEFAULT_METRICS_PORT = 9464
log = logging.getLogger("cairn.metrics")


class _SdkMetrics(Collector):
    """Scrapes the SDK's internal endpoint and yields its metric families as our own."""

    def __init__(self, url: str) -> None:
        self.url = url

    def collect(self) -> Iterator[Metric]:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as resp:  # noqa: S310 - loopback, ours
                text = resp.read().decode()
        except OSError as exc:
            log.debug("SDK metrics unavailable: %s", exc)
            return
        yield from text_string_to_metric_families(text)


@dataclass(frozen=True)
class MetricsEndpoint:
    port: int
    runtime: Runtime
    """Pass to ``Client.connect(runtime=...)`` so the SDK's metrics reach the endpoint."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def serve_metrics(port: int = DEFAULT_METRICS_PORT, host: str = "0.0.0.0") -> MetricsEndpoint:  # noqa: S104
    """Start the endpoint (a daemon thread) and the SDK runtime whose metrics it includes."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)  # first: a busy port leaks nothing
    internal = f"127.0.0.1:{free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=internal)))
    REGISTRY.register(_SdkMetrics(f"http://{internal}/metrics"))
    return MetricsEndpoint(port=int(server.server_address[1]), runtime=runtime)
