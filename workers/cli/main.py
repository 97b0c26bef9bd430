"""The ``cairn`` command: its parser, built from the command table (one module per command
group), and the dispatch of a parsed command line to its handler.

Exit codes: 0 success; 1 a checkpoint was refused, ``compare`` found differences, training
diverged, or a run failed; 2 bad input (usage, config, reference, path); 3 storage failure;
4 an external effect failed; 5 Temporal unreachable or refused the request; 130 / 143 interrupted by
SIGINT / SIGTERM (``train`` commits a checkpoint first).
The code of an error is declared on its class (``cairn.errors``).
Errors print one line on stderr (``cairn: error: <Type>: <field>: <what> (expected ..., found
...)``); with ``--json`` the error is also one JSON object on stdout; ``--debug`` adds the
traceback. ``--json`` prints exactly one JSON object on stdout, always valid JSON: whatever else
the command's code writes there (a trainer's prints, a C extension's output) goes to stderr
(``workers.cli.output.json_stdout``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import argcomplete

from cairn.errors import CairnError, CommandInterrupted
from cairn.numerics import enter_profile
from workers.cli import ckpt, drill, evaluate, interval, report, run, schema, trackers, train, worker
from workers.cli.args import CairnArgumentParser, Common, UsageError, common_options, global_options
from workers.cli.output import CommandFailed, json_stdout, report_error, report_usage_error
from workers.stack import devstack
from workers.worker import exit_now

__all__ = ["COMMANDS", "build_parser", "main"]


class CommandGroup(Protocol):
    """A module of commands: ``register`` adds its top-level command (and any subcommands)."""

    def register(self, sub: Any, common: Common) -> None: ...


COMMANDS: dict[str, CommandGroup] = {
    "train": train,
    "eval": evaluate,
    "ckpt": ckpt,
    "report": report,
    "trackers": trackers,
    "worker": worker,
    "run": run,
    "dev": devstack,
    "drill": drill,
    "plan-interval": interval,
    "schema": schema,
}
"""Each top-level command and the module that registers it, in the order ``cairn --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = CairnArgumentParser(prog="cairn", description="Durable, resumable ML training on Temporal.")
    global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMANDS.values():
        group.register(sub, common_options)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:  # a shell asking for completions (argcomplete): it answers and exits
        argcomplete.autocomplete(parser)
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        return report_usage_error(parser.format_usage(), words, exc)
    try:
        code = _dispatch(args, reexec=argv is None)
        sys.stdout.flush()
    except BrokenPipeError:
        # `cairn ... --json | head`: the reader left. Not an error worth a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    if getattr(args, "exit_hard", False) and argv is None:
        exit_now(code)  # skip interpreter teardown, which the Temporal client's native threads can abort
    return code


def _dispatch(args: argparse.Namespace, *, reexec: bool = False) -> int:
    if getattr(args, "endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint_url  # read by boto3 for every S3 client
    try:
        if getattr(args, "numerics", None):  # a command that computes: under its profile, or not at all
            enter_profile(args.numerics, reexec=reexec)  # may replace the process: before stdout is moved
        with json_stdout(getattr(args, "json", False)):
            code: int = args.handler(args)
        return code
    except CommandFailed as failed:
        return failed.code
    except CairnError as exc:
        return report_error(args, exc)
    except KeyboardInterrupt:
        stopped = getattr(args, "on_interrupt", None)
        if stopped is not None:  # the command's own way of stopping (watch: a note, the run goes on)
            return int(stopped(args))
        return report_error(args, CommandInterrupted("interrupted"))


if __name__ == "__main__":
    sys.exit(main())
