"""This worker process's node-local tier (``cairn worker --local-tier DIR --local-tier-bytes N``,
or ``CAIRN_LOCAL_TIER`` / ``CAIRN_LOCAL_TIER_BYTES``), opened once, and its metrics.

The worker sets the variables from its flags before it polls (``workers.worker``); the tier
is opened on first use (``node_tier``) and its stores' pending uploads resumed at worker start
(``resume_uploads``). Its counters reach Prometheus through a collector read at scrape time.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from activities import metrics as m
from cairn.checkpoint import NodeTier, TieredStore
from cairn.errors import ConfigError

__all__ = ["TIER_ENV", "TIER_BYTES_ENV", "parse_bytes", "node_tier", "tiered_store", "resume_uploads", "flush_all"]

TIER_ENV = "CAIRN_LOCAL_TIER"
TIER_BYTES_ENV = "CAIRN_LOCAL_TIER_BYTES"
DEFAULT_TIER_BYTES = 16 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)

log = logging.getLogger("cairn.tier")
_lock = threading.Lock()
_tier: NodeTier | None = None
_opened = False


def parse_bytes(text: str, where: str = "--local-tier-bytes") -> int:
    """``N``, ``NK``/``NM``/``NG``/``NT`` (binary units; ``GiB``, ``GB`` read the same)."""
    found = _SIZE.match(text)
    if found is None or int(found.group(1)) <= 0:
        raise ConfigError(where, expected="a size > 0 such as 8589934592 or 8GiB", found=text)
    return int(found.group(1)) * _UNITS[found.group(2).upper()]


def node_tier() -> NodeTier | None:
    """The process's tier (None when the worker has none), opened on first use."""
    global _tier, _opened
    with _lock:
        if not _opened:
            root = os.environ.get(TIER_ENV, "").strip()
            if root:
                capacity = parse_bytes(os.environ.get(TIER_BYTES_ENV, str(DEFAULT_TIER_BYTES)), TIER_BYTES_ENV)
                _tier = NodeTier(root, capacity)
                log.info("local tier %s, bounded to %d bytes", _tier.root, capacity)
            _opened = True
        return _tier


def tiered_store(url: str) -> TieredStore | None:
    """The tier in front of the durable store at ``url``, when this worker has one."""
    tier = node_tier()
    return None if tier is None else tier.tiered(url)


def resume_uploads() -> int:
    """At worker start: queue every local commit not uploaded yet; how many stores it found."""
    tier = node_tier()
    return 0 if tier is None else len(tier.resume())


def flush_all(timeout: float) -> bool:
    """At worker shutdown: wait (bounded) for the uploads still queued; True if none is left."""
    tier = node_tier()
    return True if tier is None else tier.flush_all(timeout)


_GAUGES: tuple[tuple[str, str, Callable[[NodeTier], float]], ...] = (
    ("cairn_tier_pending_checkpoints", "Local-tier checkpoints not uploaded yet.", lambda t: t.pending()[0]),
    ("cairn_tier_pending_bytes", "Bytes of local-tier checkpoints not uploaded yet.", lambda t: t.pending()[1]),
    ("cairn_tier_used_bytes", "Bytes the local tier holds (its bound counts these).", lambda t: t.used_bytes()),
)
_COUNTERS: tuple[tuple[str, str, Callable[[NodeTier], float]], ...] = (
    (
        "cairn_tier_uploaded_checkpoints",
        "Checkpoints uploaded from the local tier.",
        lambda t: t.stats.uploaded_checkpoints,
    ),
    (
        "cairn_tier_uploaded_bytes",
        "Bytes sent from the local tier to the durable store.",
        lambda t: t.stats.uploaded_bytes,
    ),
    (
        "cairn_tier_upload_failures",
        "Failed upload tries (transient ones are retried).",
        lambda t: t.stats.upload_failures,
    ),
    (
        "cairn_tier_upload_seconds",
        "Seconds spent uploading checkpoints that were uploaded.",
        lambda t: t.stats.upload_seconds,
    ),
    (
        "cairn_tier_fallbacks",
        "Saves written to the durable store synchronously: the tier was full.",
        lambda t: t.stats.fallbacks,
    ),
    ("cairn_tier_evictions", "Uploaded checkpoints evicted from the local tier.", lambda t: t.stats.evictions),
    ("cairn_tier_discarded", "Local copies discarded (failed verification or upload).", lambda t: t.stats.discarded),
)


class _TierCollector(Collector):
    """The local tier's gauges and counters, read from the tier when scraped (none without a tier)."""

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Every family this collector can yield (what the registry and the metrics reference list)."""
        yield from (GaugeMetricFamily(name, doc) for name, doc, _ in _GAUGES)
        yield from (CounterMetricFamily(name, doc) for name, doc, _ in _COUNTERS)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        tier = _tier
        if tier is None:
            return
        yield from (GaugeMetricFamily(name, doc, value=read(tier)) for name, doc, read in _GAUGES)
        yield from (CounterMetricFamily(name, doc, value=read(tier)) for name, doc, read in _COUNTERS)


m.REGISTRY.register(_TierCollector())
