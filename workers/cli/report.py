"""``cairn report``: PNG plots and a summary of a run from its store alone (no Temporal)."""

from __future__ import annotations

import argparse
from typing import Any

from cairn.config import load_config
from cairn.runs import run_record
from workers.cli.args import Common, run_id_arg, store_arg
from workers.cli.output import emit, report_dir
from workers.reports.run import write_report

__all__ = ["cmd_report", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("report", help="PNG plots and a summary of a run from its store (no Temporal needed)")
    common(p)
    p.add_argument("store")
    p.add_argument("run")
    p.add_argument("--out", metavar="DIR", help="where the PNGs go (default ./cairn-report-RUN)")
    p.add_argument("--config", help="the run's config (trusts the trainer it names)")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """A run's report from its store alone (no Temporal): loss, lr, commits, speed."""
    run_id = run_id_arg(args.run, "RUN")
    assert run_id is not None
    config = load_config(args.config) if args.config else None
    record = run_record(store_arg(args.store, must_exist=True), run_id, config)
    result, text, files = write_report(record, report_dir(args.out, run_id))
    emit(args, {**result, "files": [str(f) for f in files]}, text)
    return 0
