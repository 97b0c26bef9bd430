"""The Cairn Temporal worker: ``cairn worker`` (or ``python -m workers.worker``).

Registers the TrainingRun workflow and every activity, runs activities in a thread pool, and
on SIGTERM/SIGINT shuts down gracefully: a running segment notices, commits a checkpoint at
its current step and hands the rest back to Temporal, which retries it on another worker.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.effects import EFFECT_ACTIVITIES
from activities.models import DEFAULT_TASK_QUEUE
from activities.training import TRAINING_ACTIVITIES
from cairn.errors import TemporalUnavailableError
from workers.client import add_connection_args, connect
from workflows.training_run import TrainingRun

__all__ = ["build_worker", "all_activities", "WORKFLOWS", "HEARTBEAT_THROTTLE", "configure_logging", "main"]

WORKFLOWS: list[type] = [TrainingRun]
HEARTBEAT_THROTTLE = timedelta(milliseconds=200)
"""How stale the server's view of a segment may be (its step, for ``recomputed_steps`` and
``cairn run watch``), and how soon pause / stop / checkpoint-now reach a running segment."""


def all_activities() -> list[Any]:
    return [*TRAINING_ACTIVITIES, *EFFECT_ACTIVITIES]


def build_worker(client: Client, task_queue: str = DEFAULT_TASK_QUEUE, *, max_activities: int = 4) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=all_activities(),
        activity_executor=ThreadPoolExecutor(max_workers=max_activities, thread_name_prefix="cairn-activity"),
        max_concurrent_activities=max_activities,
        graceful_shutdown_timeout=timedelta(seconds=30),
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )


class _QuietExpectedFailures(logging.Filter):
    """The SDK logs every failed activity with a traceback; a hand-back on SIGTERM and a
    segment interrupted on request are expected, and the activity logs them in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return getattr(exc, "type", None) not in ("WorkerShutdown", "SegmentInterrupted")


def configure_logging(level: int = logging.INFO) -> None:
    """Worker logs say what training does (segments, resume points, commits, loss), once."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # boto3 announces credential discovery at INFO for every client it builds: not news.
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("temporalio.activity").addFilter(_QuietExpectedFailures())


async def run(args: argparse.Namespace) -> int:
    """Poll until SIGTERM/SIGINT, then shut down gracefully. Returns the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        client = await connect(args.address, args.namespace)
    except RuntimeError as exc:  # the SDK's connection failure
        raise TemporalUnavailableError(f"cannot connect to Temporal: {exc}") from None
    worker = build_worker(client, args.task_queue, max_activities=args.max_activities)
    target = client.service_client.config.target_host
    logging.getLogger("cairn.worker").info("polling task queue %r on %s", args.task_queue, target)
    print(f"cairn worker: polling {args.task_queue!r} on {target}", flush=True)
    async with worker:
        await stop.wait()
        print("cairn worker: shutting down gracefully (running segments checkpoint and hand back)", flush=True)
    print("cairn worker: stopped", flush=True)
    return 0


def exit_now(code: int) -> None:
    """End the process without interpreter teardown: the Temporal client's native threads can
    abort CPython's finalization (``Fatal Python error: PyGILState_Release``,
    temporalio/sdk-python#300), which a supervisor would read as a crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"default {DEFAULT_TASK_QUEUE!r}")
    p.add_argument("--max-activities", type=int, default=4, help="concurrent activities (threads)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn worker", description=__doc__.splitlines()[0])
    add_worker_args(parser)
    args = parser.parse_args(argv)
    configure_logging()
    try:
        return asyncio.run(run(args))
    except TemporalUnavailableError as exc:
        print(f"cairn worker: error: {exc.type_name}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    exit_now(main())
