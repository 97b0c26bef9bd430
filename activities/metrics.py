"""Cairn's own Prometheus metrics, recorded by the activities where things happen.

The worker serves them (with the Temporal SDK's runtime metrics) on one endpoint:
``workers.metrics.serve_metrics``. Labels stay low-cardinality (no run ids): a dashboard sums
over the fleet; per-run detail is in the logs and ``cairn run report``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "REGISTRY",
    "STEPS",
    "SEGMENTS",
    "CHECKPOINT_BYTES",
    "SAVE_SECONDS",
    "RESTORE_SECONDS",
    "COMMITS",
    "CONFLICTS",
    "RECOVERIES",
    "STEPS_RECOMPUTED",
    "EFFECTS",
    "ACTIVITY_FAILURES",
    "SEGMENT_STARTS",
    "WARM_RUNS",
    "WARM_BYTES",
    "RESTORES",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""Cairn's registry (not the process-global default one: tests and embedders stay isolated)."""

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BYTES = tuple(float(1 << k) for k in range(10, 38, 2))  # 1 KiB .. 128 GiB

STEPS = Counter("cairn_training_steps", "Training updates computed (recomputed ones included).", registry=REGISTRY)
SEGMENTS = Counter(
    "cairn_segments",
    "train_segment attempts by outcome: completed, interrupted (pause/stop/checkpoint-now/cancel), "
    "handed_back (worker shutdown), superseded (the worker stalled past the heartbeat timeout: nothing committed), "
    "failed.",
    ["outcome"],
    registry=REGISTRY,
)
CHECKPOINT_BYTES = Histogram(
    "cairn_checkpoint_bytes", "Tensor bytes per committed checkpoint.", buckets=_BYTES, registry=REGISTRY
)
SAVE_SECONDS = Histogram(
    "cairn_checkpoint_save_seconds", "Seconds per checkpoint save (shards + commit).", buckets=_SECONDS,
    registry=REGISTRY,
)  # fmt: skip
RESTORE_SECONDS = Histogram(
    "cairn_checkpoint_restore_seconds",
    "Seconds to restore a segment's state (validated import of the latest checkpoint, or a fresh start).",
    buckets=_SECONDS,
    registry=REGISTRY,
)
COMMITS = Counter(
    "cairn_checkpoint_commits",
    "Checkpoint commits by outcome: created, or existing (identical content already committed: a retry).",
    ["outcome"],
    registry=REGISTRY,
)
CONFLICTS = Counter(
    "cairn_checkpoint_conflicts",
    "Commits refused because different content was already committed under the key (non-determinism).",
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "cairn_recoveries", "Segment attempts after the first: resumed from the last durable checkpoint.",
    registry=REGISTRY,
)  # fmt: skip
STEPS_RECOMPUTED = Counter(
    "cairn_steps_recomputed", "Steps an earlier attempt had computed and a retry computed again.", registry=REGISTRY
)
EFFECTS = Counter(
    "cairn_effects",
    "External effects by effect and outcome: performed, replayed (key already known), reconciled (a pending "
    "intent resolved by asking the service). Failed attempts count in cairn_activity_failures.",
    ["effect", "outcome"],
    registry=REGISTRY,
)
ACTIVITY_FAILURES = Counter(
    "cairn_activity_failures", "Activity attempts that failed, by activity and error type.", ["activity", "type"],
    registry=REGISTRY,
)  # fmt: skip
SEGMENT_STARTS = Counter(
    "cairn_segment_starts",
    "train_segment attempts by how their state was obtained: warm (the worker's memory: no build, no restore) "
    "or cold (a restore from the store, or a fresh start).",
    ["path"],
    registry=REGISTRY,
)
WARM_RUNS = Gauge("cairn_warm_runs", "Runs whose training state this worker holds in memory.", registry=REGISTRY)
WARM_BYTES = Gauge(
    "cairn_warm_state_bytes", "Bytes of training state this worker holds in memory for warm runs.", registry=REGISTRY
)
RESTORES = Counter(
    "cairn_checkpoint_restores",
    "Segment starts by where their state came from: local (the node-local tier's copy, verified), durable "
    "(the durable store), fresh (no checkpoint yet) or memory (a warm segment).",
    ["tier"],
    registry=REGISTRY,
)
