"""The Cairn Temporal worker: ``cairn worker`` (or ``python -m workers.worker``).

Registers the TrainingRun workflow and every activity, runs activities in a thread pool, and
on SIGTERM/SIGINT shuts down gracefully: a running segment notices, commits a checkpoint at
its current step and hands the rest back to Temporal, which retries it on another worker.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.models import DEFAULT_TASK_QUEUE
from activities.training import TRAINING_ACTIVITIES
from workers.client import add_connection_args, connect
from workflows.training_run import TrainingRun

__all__ = ["build_worker", "all_activities", "WORKFLOWS", "main"]

WORKFLOWS: list[type] = [TrainingRun]


def all_activities() -> list[Any]:
    activities: list[Any] = list(TRAINING_ACTIVITIES)
    try:
        from activities.effects import EFFECT_ACTIVITIES
    except ImportError:  # pragma: no cover - effects are optional in minimal installs
        return activities
    return activities + list(EFFECT_ACTIVITIES)


def build_worker(client: Client, task_queue: str = DEFAULT_TASK_QUEUE, *, max_activities: int = 4) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=all_activities(),
        activity_executor=ThreadPoolExecutor(max_workers=max_activities, thread_name_prefix="cairn-activity"),
        max_concurrent_activities=max_activities,
        graceful_shutdown_timeout=timedelta(seconds=30),
        # Heartbeats carry cancellation back to a segment: keep that under about a second,
        # so pause / stop / checkpoint-now take effect promptly.
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
    )


async def run(args: argparse.Namespace) -> int:
    client = await connect(args.address, args.namespace)
    worker = build_worker(client, args.task_queue, max_activities=args.max_activities)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.info("cairn worker polling task queue %r on %s", args.task_queue, client.service_client.config.target_host)
    print(f"cairn worker: polling {args.task_queue!r} on {client.service_client.config.target_host}", flush=True)
    async with worker:
        await stop.wait()
        print("cairn worker: shutting down gracefully (running segments checkpoint and hand back)", flush=True)
    return 0


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"default {DEFAULT_TASK_QUEUE!r}")
    p.add_argument("--max-activities", type=int, default=4, help="concurrent activities (threads)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn worker", description=__doc__.splitlines()[0])
    add_worker_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
