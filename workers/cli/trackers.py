"""``cairn trackers``: feed a run's experiment trackers from its store (no Temporal): what the
``export_trackers`` activity does beside a run's segments, for runs trained in-process
(``cairn train``) or to catch a tracker up. Each committed step is written once, whatever ran
before: the sinks' cursors are in the run's store."""

from __future__ import annotations

import argparse
import os
from typing import Any

from cairn.errors import ConfigError
from cairn.trackers import MLflowSink, TensorBoardSink, TrackerSink, WandbSink, committed_history, export_committed
from workers.cli.args import Common, run_id_arg, store_arg
from workers.cli.output import emit

__all__ = ["cmd_trackers", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("trackers", help="write a run's committed history to TensorBoard, MLflow or W&B, each step once")
    common(p)
    p.add_argument("store")
    p.add_argument("run")
    p.add_argument("--tensorboard", metavar="LOG_DIR", help="TensorBoard event files under LOG_DIR/RUN")
    p.add_argument("--mlflow", metavar="URI", help="an MLflow tracking URI: file:/DIR or http(s)://")
    p.add_argument("--experiment", default="cairn", help="the MLflow experiment (default: cairn)")
    p.add_argument("--wandb", metavar="PROJECT", help="a Weights & Biases project (needs --wandb-dir)")
    p.add_argument("--wandb-dir", metavar="DIR", help="where W&B keeps its files")
    p.add_argument("--wandb-mode", choices=("offline", "online"), default="offline")
    p.add_argument("--final", action="store_true", help="the run has ended: trackers mark their run finished")
    p.set_defaults(handler=cmd_trackers)


def _sinks(args: argparse.Namespace) -> list[TrackerSink]:
    sinks: list[TrackerSink] = []
    if args.tensorboard:
        sinks.append(TensorBoardSink(os.path.abspath(args.tensorboard)))
    if args.mlflow:
        sinks.append(MLflowSink(args.mlflow, args.experiment))
    if args.wandb:
        if not args.wandb_dir:
            raise ConfigError("--wandb-dir", expected="a directory for W&B's files", found=None)
        sinks.append(WandbSink(args.wandb, os.path.abspath(args.wandb_dir), args.wandb_mode))
    if not sinks:
        raise ConfigError("tracker", expected="--tensorboard, --mlflow or --wandb", found="none")
    return sinks


def cmd_trackers(args: argparse.Namespace) -> int:
    run_id = run_id_arg(args.run, "RUN")
    assert run_id is not None
    sinks = _sinks(args)
    store = store_arg(args.store, must_exist=True)
    history = committed_history(store, run_id)
    reports = [export_committed(store, run_id, sink, final=args.final, history=history) for sink in sinks]
    payload = {
        "run_id": run_id,
        "committed_step": history.step if history is not None else 0,
        "trackers": [{"sink": r.sink, "confirmed": r.confirmed, "points": r.points} for r in reports],
    }
    emit(args, payload, "\n".join(r.line() for r in reports))
    return 0
