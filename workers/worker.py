"""The Cairn Temporal worker process: ``cairn worker --no-supervisor`` or ``python -m
workers.worker`` (``cairn worker`` runs it under a supervisor, ``workers.supervisor``).

Registers the TrainingRun workflow and every activity, runs activities in a thread pool, and
on SIGTERM/SIGINT shuts down gracefully: a running segment notices, commits a checkpoint at
its current step and hands the rest back to Temporal, which retries it on another worker.
Under a supervisor it reports every activity attempt to it (``ActivityReporter``), and that it
is alive, from its event loop, a few times a second (a silent one is killed as hung).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Interceptor, PollerBehaviorSimpleMaximum, Worker

from activities.effects import EFFECT_ACTIVITIES
from activities.gang import ADVERTISE_ENV, GANG_ACTIVITIES
from activities.inputs import DEFAULT_TASK_QUEUE, NODE_NAME, node_queue, own_queue
from activities.tier import TIER_BYTES_ENV, TIER_ENV, flush_all, parse_bytes, resume_uploads
from activities.trackers import TRACKER_ACTIVITIES
from activities.training import TRAINING_ACTIVITIES
from cairn.errors import ConfigError, TemporalUnavailableError
from cairn.numerics import enter_profile, native_level, process_numerics, profile_id, profile_queue
from workers.cli.args import add_numerics_arg
from workers.client import add_connection_args, connect
from workers.logs import LOG_FORMATS, configure_logging, log_format_from_env
from workers.metrics import DEFAULT_METRICS_PORT, MetricsEndpoint, serve_metrics
from workers.supervisor.channel import ActivityReport, ReportWriter, reporter_from_environment
from workers.supervisor.interceptor import ActivityReporter
from workflows.training_run import TrainingRun

__all__ = [
    "build_worker",
    "serving",
    "worker_queues",
    "all_activities",
    "WORKFLOWS",
    "HEARTBEAT_THROTTLE",
    "STICKY_PICKUP",
    "ACTIVITY_POLLS",
    "WORKFLOW_POLLS",
    "main",
    "exit_now",
    "say",
]

WORKFLOWS: list[type] = [TrainingRun]
HEARTBEAT_THROTTLE = timedelta(milliseconds=200)
"""How stale the server's view of a segment may be (its step, for ``recomputed_steps`` and
``cairn run watch``), and how soon pause / stop / checkpoint-now reach a running segment."""


STICKY_PICKUP = timedelta(seconds=1)
"""How long a run's workflow task waits on the sticky queue of the worker that ran its last one
before it goes to every worker. A live worker always has a sticky poll open (milliseconds); a dead
or frozen one never takes it, and the server still counts it as polling for 10 s after its last
poll, so this wait is part of every recovery whose workflow worker was the lost one. (Shorter
values are not kept: 0.5 s and 0.2 s both timed out after 1.0 s on the dev server.)"""
ACTIVITY_POLLS = 1
"""Activity polls a worker keeps open per task queue (the SDK's default is 5). A frozen process's
open polls stay at the server, which hands them tasks it will not run, each lost to a heartbeat
timeout, until the frontend's keepalive closes its connection (the README's "Operating it")."""
WORKFLOW_POLLS = 2
"""Workflow task polls: one sticky, one normal (the SDK's least with a workflow cache)."""


ALIVE_EVERY_S = 0.25
"""How often a supervised worker process tells its supervisor it is alive (its event loop runs:
the heartbeats of its attempts can reach the server)."""


TIER_FLUSH_SECONDS = 60.0
"""How long a worker stopping on request waits for its local tier's pending uploads."""


def all_activities() -> list[Any]:
    return [*TRAINING_ACTIVITIES, *EFFECT_ACTIVITIES, *GANG_ACTIVITIES, *TRACKER_ACTIVITIES]


def build_worker(
    client: Client,
    task_queue: str = DEFAULT_TASK_QUEUE,
    *,
    max_activities: int = 4,
    workflows: bool = True,
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    """A worker of ``task_queue``; ``workflows=False``: activities only (a node's own queue)."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS if workflows else [],
        activities=all_activities(),
        interceptors=interceptors,
        activity_executor=ThreadPoolExecutor(max_workers=max_activities, thread_name_prefix="cairn-activity"),
        max_concurrent_activities=max_activities,
        graceful_shutdown_timeout=timedelta(seconds=30),
        # After a worker dies or freezes, its runs' workflow tasks wait this long on its sticky
        # queue before any worker takes them (the default 10 s added that much to every recovery).
        sticky_queue_schedule_to_start_timeout=STICKY_PICKUP,
        # A frozen process's open polls stay at the server, which hands them tasks it cannot run.
        activity_task_poller_behavior=PollerBehaviorSimpleMaximum(ACTIVITY_POLLS),
        workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(WORKFLOW_POLLS),
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )


def say(args: argparse.Namespace, text: str) -> None:
    """A lifecycle line: on stdout in text mode, as a log record in JSON mode (one stream)."""
    if getattr(args, "log_format", "text") == "json":
        logging.getLogger("cairn.worker").info(text)
    else:
        print(f"cairn worker: {text}", flush=True)


async def run(args: argparse.Namespace) -> int:
    """Poll until SIGTERM/SIGINT, then shut down gracefully. Returns the exit status."""
    if args.max_activities < 1:
        raise ConfigError("--max-activities", expected=">= 1", found=args.max_activities)
    if args.node and not re.match(NODE_NAME, args.node):
        raise ConfigError("--node", expected=NODE_NAME, found=args.node)
    if args.advertise_addr:
        os.environ[ADVERTISE_ENV] = args.advertise_addr  # read by gang_endpoint on this host
    if args.local_tier:  # read by the training activities (activities.tier)
        os.environ[TIER_ENV] = args.local_tier
        os.environ[TIER_BYTES_ENV] = str(parse_bytes(args.local_tier_bytes))
        await asyncio.to_thread(resume_uploads)  # a crashed worker's local commits: uploaded in the background
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reporter = reporter_from_environment()  # under a supervisor: it learns of every attempt
    interceptors = [ActivityReporter(reporter)] if reporter is not None else []
    endpoint = _start_metrics(args.metrics_port)
    try:
        client = await connect(args.address, args.namespace, runtime=endpoint.runtime if endpoint else None)
    except RuntimeError as exc:  # the SDK's connection failure
        raise TemporalUnavailableError(f"cannot connect to Temporal: {exc}") from None
    if args.preload:  # before polling: a task this worker takes must not wait for `import torch`
        await asyncio.to_thread(_preload, args.preload)
    queues = worker_queues(args.task_queue, profile_id(args.numerics), args.node)
    target = client.service_client.config.target_host
    metrics = f"; metrics on {endpoint.url}" if endpoint else ""
    say(args, f"numerics profile {args.numerics} on a {native_level()} machine")
    say(args, f"polling {', '.join(repr(q) for q in queues)} on {target}{metrics}")
    warm = asyncio.create_task(asyncio.to_thread(_warm_up))
    alive = asyncio.create_task(_tell_alive(reporter)) if reporter is not None else None
    try:
        async with contextlib.AsyncExitStack() as stack:
            for i, queue in enumerate(queues):
                await stack.enter_async_context(
                    build_worker(
                        client, queue, max_activities=args.max_activities, workflows=i == 0, interceptors=interceptors
                    )
                )
            await stop.wait()
            warm.cancel()
            say(args, "shutting down gracefully (running segments checkpoint and hand back)")
        if args.local_tier and not await asyncio.to_thread(flush_all, TIER_FLUSH_SECONDS):
            say(
                args,
                f"local tier: uploads pending after {TIER_FLUSH_SECONDS:.0f} s; the next worker on it resumes them",
            )
    finally:
        if alive is not None:
            alive.cancel()
    say(args, "stopped")
    return 0


async def _tell_alive(reporter: ReportWriter) -> None:
    beat = ActivityReport(event="alive")
    while True:
        reporter.send(beat)
        await asyncio.sleep(ALIVE_EVERY_S)


def worker_queues(task_queue: str, numerics_id: str, node: str | None = None) -> list[str]:
    """What a worker polls: the run queue (workflows and bookkeeping), the queue of its numerics
    profile (the training segments of runs under that profile), this worker's own queue beside
    each of those two (the next segment of a run it holds in memory is offered there first:
    ``activities.inputs.own_queue``) and, on a named node, the node's queue (its share of a gang)."""
    shared = [task_queue, profile_queue(task_queue, numerics_id)]
    queues = [*shared, *(own_queue(q) for q in shared)]
    if node:
        queues.append(node_queue(task_queue, node))
    return queues


@contextlib.asynccontextmanager
async def serving(
    client: Client, task_queue: str, *, max_activities: int = 4, node: str | None = None
) -> AsyncIterator[list[str]]:
    """Run an in-process worker of every queue ``cairn worker`` would poll (tests, demos); yields
    the queues. The numerics profile is this process's own."""
    queues = worker_queues(task_queue, process_numerics().id, node)
    async with contextlib.AsyncExitStack() as stack:
        for i, queue in enumerate(queues):
            await stack.enter_async_context(
                build_worker(client, queue, max_activities=max_activities, workflows=i == 0)
            )
        yield queues


def _warm_up() -> None:
    """Build one S3 client now, so the first segment this worker runs (often the retry of a
    crashed one) does not pay for loading botocore's S3 model (~0.5 s): recovery time."""
    from cairn.stores import S3Store

    with contextlib.suppress(Exception):  # only an optimisation: the first real store reports errors
        S3Store("cairn-warm-up").close()


def _preload(preload: str) -> None:
    """Import the ``--preload`` modules (your trainers' packages: ``import torch`` alone takes
    seconds), so that a retried segment this worker takes starts training at once."""
    import importlib

    for name in [m.strip() for m in preload.split(",") if m.strip()]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the segment that needs it reports it, typed
            logging.getLogger("cairn.worker").warning("preload of %r failed: %s: %s", name, type(exc).__name__, exc)


def _start_metrics(port_text: str) -> MetricsEndpoint | None:
    """The Prometheus endpoint; a port already taken costs the metrics, never the worker."""
    if port_text.strip().lower() in ("off", "none", ""):
        return None
    text = port_text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise ConfigError("--metrics-port", expected="a port number, 0 (any free port) or 'off'", found=port_text)
    port = int(text)
    try:
        return serve_metrics(port)
    except OSError as exc:
        logging.getLogger("cairn.worker").warning(
            "metrics endpoint not started on port %s: %s (the worker runs without it; --metrics-port 0 picks a "
            "free port)",
            port,
            exc.strerror,
        )
        return None


def exit_now(code: int) -> None:
    """End the process without interpreter teardown: the Temporal client's native threads can
    abort CPython's finalization (``Fatal Python error: PyGILState_Release``), which a
    supervisor would read as a crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"default {DEFAULT_TASK_QUEUE!r}")
    p.add_argument("--max-activities", type=int, default=4, help="concurrent activities (threads)")
    p.add_argument(
        "--metrics-port",
        default=os.environ.get("CAIRN_METRICS_PORT", str(DEFAULT_METRICS_PORT)),
        help=f"Prometheus endpoint port (env CAIRN_METRICS_PORT; default {DEFAULT_METRICS_PORT}; 0: any free; off)",
    )
    p.add_argument(
        "--preload",
        default=os.environ.get("CAIRN_PRELOAD", ""),
        metavar="MODULES",
        help="comma-separated modules to import at start, e.g. your trainer's (env CAIRN_PRELOAD): "
        "a retried segment then does not wait for `import torch`",
    )
    p.add_argument(
        "--node",
        default=os.environ.get("CAIRN_NODE", ""),
        metavar="NAME",
        help="this host's name in runs' 'nodes' (env CAIRN_NODE): also poll the queue QUEUE@NAME, "
        "where a distributed run sends this node's gang activity",
    )
    p.add_argument(
        "--advertise-addr",
        default=os.environ.get(ADVERTISE_ENV, ""),
        metavar="HOST",
        help=f"address other nodes reach this host at, for a gang's rendezvous (env {ADVERTISE_ENV}; "
        "default: the hostname)",
    )
    p.add_argument(
        "--local-tier",
        default=os.environ.get(TIER_ENV, ""),
        metavar="DIR",
        help=f"a node-local checkpoint tier (local disk or tmpfs; env {TIER_ENV}): checkpoints commit there and "
        "upload to the run's store in the background",
    )
    p.add_argument(
        "--local-tier-bytes",
        default=os.environ.get(TIER_BYTES_ENV, "16GiB"),
        metavar="N",
        help=f"the local tier's bound in bytes (env {TIER_BYTES_ENV}; default 16GiB; suffixes K, M, G, T)",
    )
    add_numerics_arg(p, "trains segments")
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=log_format_from_env(),
        help="text or json lines (env CAIRN_LOG_FORMAT; default text)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn worker", description=__doc__.splitlines()[0])
    add_worker_args(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_format)
    try:
        enter_profile(args.numerics, reexec=argv is None)  # before anything is computed
        return asyncio.run(run(args))
    except (TemporalUnavailableError, ConfigError) as exc:
        print(f"cairn worker: error: {exc.type_name}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    exit_now(main())
