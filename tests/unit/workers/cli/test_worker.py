"""``cairn worker``: the supervised worker process is started with this command's own options."""

from __future__ import annotations

import argparse
import sys

import pytest

from workers.cli import worker
from workers.cli.args import common_options


def worker_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    top = argparse.ArgumentParser(prog="cairn")
    sub = top.add_subparsers(dest="command")
    worker.register(sub, common_options)
    return top, sub.choices["worker"]


@pytest.mark.parametrize(
    "words",
    [
        ["worker"],
        ["worker", "--address", "temporal:7233", "--task-queue", "q", "--max-activities", "2", "--json"],
        ["worker", "--node", "host-a", "--advertise-addr", "10.0.0.5", "--metrics-port", "off", "--log-format", "json"],
        ["worker", "--preload", "mypkg.train,torch", "--numerics", "x86-64-v2", "--endpoint-url", "http://s3:9000"],
    ],
)
def test_the_worker_process_gets_every_option(words: list[str]) -> None:
    top, parser = worker_parser()
    args = top.parse_args(words)
    argv = worker.worker_process_argv(parser, args)
    assert argv[:5] == [sys.executable, "-m", "workers.cli", "worker", "--no-supervisor"]
    child = top.parse_args(argv[3:])
    assert child.no_supervisor and not args.no_supervisor
    same = {k: v for k, v in vars(child).items() if k not in ("no_supervisor", "handler")}
    assert same == {k: v for k, v in vars(args).items() if k not in ("no_supervisor", "handler")}
