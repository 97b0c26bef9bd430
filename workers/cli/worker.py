"""``cairn worker``: a Temporal worker of the TrainingRun workflow and its activities, in this
process, until SIGTERM or SIGINT (``workers.worker``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from workers.cli.args import Common
from workers.logs import configure_logging
from workers.worker import add_worker_args, run

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("worker", help="run a Temporal worker (workflows + activities)")
    common(p)
    add_worker_args(p)
    p.set_defaults(handler=_worker, exit_hard=True)


def _worker(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    return asyncio.run(run(args))
