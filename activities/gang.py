"""Gang activities: one per node of a data-parallel segment, each supervising its rank processes.

``train_gang_node`` runs on the worker of one node (routed there by that worker's own task
queue, ``node_queue``). It starts torchrun for the node's ranks (``cairn.gang.launch``),
which rendezvous through c10d with the other nodes' ranks; it heartbeats the ranks' progress;
on cancellation (pause, stop, checkpoint-now, workflow cancel) or worker shutdown it asks the
ranks to checkpoint and stop at the next step; and whatever happens — a rank's death, a
failure, a cancel — it returns only after every rank process of its node is gone. The
workflow fails the whole gang when any node fails and retries it from the last committed
checkpoint (``workflows.training_run``).

``gang_endpoint`` runs on node 0 and picks the rendezvous address the nodes meet at.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from temporalio import activity

from activities import metrics as m
from activities.edge import (
    Heartbeater,
    activity_errors,
    as_application_error,
    heartbeat_interval,
    interruption,
    open_run_store,
    recomputed_steps,
    require_numerics,
)
from activities.inputs import GangEndpointInput, GangNodeInput, TrainSegmentResult
from activities.log_context import run_context, set_step
from cairn.errors import CairnError, ConfigError
from cairn.gang import Gang, GangJob, GangSpec, free_endpoint
from cairn.runs import SegmentOutcome, require_run_owner

__all__ = ["train_gang_node", "gang_endpoint", "GANG_ACTIVITIES", "ADVERTISE_ENV"]

log = logging.getLogger("cairn.activity")

ADVERTISE_ENV = "CAIRN_ADVERTISE_ADDR"
"""The address other nodes reach this worker's host at (``cairn worker --advertise-addr``)."""


def advertised_host() -> str:
    return os.environ.get(ADVERTISE_ENV) or socket.gethostname()


@activity.defn(name="gang_endpoint")
def gang_endpoint(inp: GangEndpointInput) -> str:
    """``HOST:PORT`` for the gang's rendezvous store, on this (node 0's) host."""
    with run_context(inp.run_id):
        return free_endpoint(advertised_host())


@activity.defn(name="train_gang_node")
def train_gang_node(inp: GangNodeInput) -> TrainSegmentResult:
    info = activity.info()
    with run_context(inp.run_id), activity.shield_thread_cancel_exception():
        with activity_errors():
            result, interrupted = _train_gang_node(inp, info)
        if interrupted:
            m.SEGMENTS.labels("interrupted").inc()
            raise interruption(inp.run_id, result, "gang segment")
        m.SEGMENTS.labels("completed").inc()
        return result


def _train_gang_node(inp: GangNodeInput, info: activity.Info) -> tuple[TrainSegmentResult, bool]:
    reached_before = inp.reached_before
    attempt = inp.attempt
    nproc = inp.world_size // inp.nnodes
    beats = Heartbeater(
        min(inp.heartbeat_every_seconds, heartbeat_interval()),
        step=None,
        reached=reached_before,
        checkpoint=None,
        attempt=attempt,
        loss=None,
        node=inp.node_index,
        ranks=nproc,
    )
    with beats:
        if importlib.util.find_spec("torch") is None:  # torchrun would exit 1: a retry would too
            raise ConfigError(
                "distributed runs need the torch extra on every node's worker (pip install 'cairn-train[torch]')",
                field="world_size",
                expected="torch installed on this worker",
                found="no module named 'torch'",
            )
        require_numerics(inp.numerics_id)
        store = open_run_store(inp.store, inp.store_id)
        require_run_owner(store, inp.run_id, info.workflow_id)
        job = GangJob(
            run_id=inp.run_id,
            store=inp.store,
            config=inp.config,
            target_step=inp.target_step,
            checkpoint_every=inp.checkpoint_every,
            resume_from=inp.resume_from,
            throttle_seconds_per_step=inp.throttle_seconds_per_step,
            incremental=inp.incremental,
            compression=inp.compression,
        )
        spec = GangSpec(
            nproc_per_node=nproc,
            nnodes=inp.nnodes,
            rendezvous=inp.rendezvous,
            rdzv_id=inp.rdzv_id,
            is_host=inp.node_index == 0,
            local_addr=advertised_host() if inp.nnodes > 1 else None,
        )
        with tempfile.TemporaryDirectory(prefix="cairn-gang-") as tmp:
            gang = Gang(spec, job, Path(tmp))
            log.info(
                "run %s: gang segment to step %d: node %d of %d, %d rank(s) of %d (%s)",
                inp.run_id,
                inp.target_step,
                inp.node_index,
                inp.nnodes,
                nproc,
                inp.world_size,
                inp.rdzv_id,
            )
            gang.start()

            def on_progress(doc: dict[str, Any]) -> None:
                step = doc.get("step")
                if isinstance(step, int):
                    set_step(step)
                    beats.update(
                        step=step,
                        reached=max(step, reached_before or 0),
                        loss=doc.get("loss"),
                        checkpoint=doc.get("checkpoint"),
                        committed_step=doc.get("committed_step"),
                    )

            try:
                out = gang.supervise(
                    on_progress=on_progress,
                    cancelled=lambda: activity.is_cancelled() or activity.is_worker_shutdown(),
                    hang_after=hang_limit(info),
                    # A worker shutting down lets ranks that are starting checkpoint and hand the
                    # segment back; a cancelled node (a peer failed, the run paused) stops at once.
                    abandoned=activity.is_cancelled,
                )
            except CairnError as exc:  # the workflow retries the gang; it learns how far it got
                log.warning("run %s: gang node %d failed: %s: %s", inp.run_id, inp.node_index, exc.type_name, exc)
                reached = {"reached": beats.details().get("reached"), "attempt": attempt}
                raise as_application_error(exc, reached) from None
    recomputed = recomputed_steps(reached_before, out.resumed_from_step, attempt)
    outcome = out.model_dump(include=set(SegmentOutcome.model_fields))
    result = TrainSegmentResult(**outcome, attempt=attempt, recomputed_steps=recomputed, compression=out.compression)
    log.info("run %s: gang segment ended at step %d (%s)", inp.run_id, result.step, result.checkpoint)
    return result, out.interrupted


def hang_limit(info: activity.Info) -> float | None:
    """How long a rank may be silent before its gang is stopped as hung: the attempt's heartbeat
    timeout, what a dead host costs (a frozen rank must not cost more); None: the gang's default."""
    timeout = info.heartbeat_timeout
    return timeout.total_seconds() if timeout else None


GANG_ACTIVITIES = [train_gang_node, gang_endpoint]
