"""``cairn worker``: a Temporal worker of the TrainingRun workflow and its activities until
SIGTERM or SIGINT — a supervisor process and its worker process (``workers.supervisor``), or,
with ``--no-supervisor``, the worker process alone (``workers.worker``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from typing import Any

from workers.cli.args import Common
from workers.client import connect
from workers.logs import configure_logging
from workers.supervisor import Supervisor
from workers.worker import add_worker_args, run, say

__all__ = ["register", "worker_process_argv"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("worker", help="run a Temporal worker (workflows + activities)")
    common(p)
    add_worker_args(p)
    p.add_argument(
        "--no-supervisor",
        action="store_true",
        help="run the worker process alone: no supervisor to fail the attempts of a worker process that dies "
        "(they wait for their heartbeat timeout) or to restart it",
    )
    p.set_defaults(handler=partial(_worker, p), exit_hard=True)


def _worker(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    if args.no_supervisor:
        return asyncio.run(run(args))
    supervisor = Supervisor(
        worker_process_argv(parser, args),
        connect=partial(connect, args.address, args.namespace),
        say=partial(say, args),
    )
    return asyncio.run(supervisor.run())


def worker_process_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command line of the supervised worker process: this command with ``--no-supervisor``
    and every option it was given (defaults read from the environment included, so both
    processes agree)."""
    argv = [sys.executable, "-m", "workers.cli", "worker", "--no-supervisor"]
    for action in parser._actions:  # argparse has no public list of a parser's options
        if not action.option_strings or action.dest in ("help", "no_supervisor"):
            continue
        flag = max(action.option_strings, key=len)
        value = getattr(args, action.dest, None)
        if action.nargs == 0:  # a switch
            if value is True:
                argv.append(flag)
        elif isinstance(value, list):  # a repeated option
            for item in value:
                argv += [flag, str(item)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv
