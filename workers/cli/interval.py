"""``cairn plan-interval``: checkpoint interval advice (Young/Daly, ``cairn.checkpoint_interval``) from
measurements in a drill's report, in a run's store, or given as flags."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from cairn.checkpoint_interval import advise
from cairn.config import load_config
from cairn.errors import ConfigError
from cairn.jsonio import load_json_file
from cairn.runs import run_record
from workers.cli.args import Common, count, store_arg
from workers.cli.output import emit

__all__ = ["cmd_plan_interval", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("plan-interval", help="checkpoint interval advice (Young/Daly) from a run's measurements")
    common(p)
    p.add_argument("--report", metavar="DRILL_JSON", help="a drill's drill.json (save cost, MTBF, step time)")
    p.add_argument("--store", help="a run's store: step time and interval from its commit times (with --run)")
    p.add_argument("--run", help="the run id in --store")
    p.add_argument("--config", help="the run's config, with --store (trusts the trainer it names)")
    p.add_argument("--save-seconds", type=float, help="seconds one checkpoint save costs (C)")
    p.add_argument("--mtbf-seconds", type=float, help="mean time between failures in seconds (M)")
    p.add_argument("--step-seconds", type=float, help="seconds per training step")
    p.add_argument("--restart-seconds", type=float, help="detection + restore after a failure (R)")
    p.add_argument("--every", type=count, help="the run's checkpoint interval in steps")
    p.set_defaults(handler=cmd_plan_interval)


def _measurements_from_store(store_url: str, run_id: str, config: str | None) -> dict[str, float]:
    """Seconds per step and the checkpoint interval, from a run's commit times in its store."""
    record = run_record(store_arg(store_url, must_exist=True), run_id, load_config(config) if config else None)
    timed = [c for c in record.commits if c.at is not None]
    rates = []
    for a, b in zip(timed, timed[1:], strict=False):
        assert a.at is not None and b.at is not None
        seconds = (b.at - a.at).total_seconds()
        if seconds > 0 and b.step > a.step:
            rates.append(seconds / (b.step - a.step))
    found: dict[str, float] = {}
    if rates:
        found["step_seconds"] = statistics.median(rates)
    gaps = [b.step - a.step for a, b in zip(record.commits, record.commits[1:], strict=False) if b.step > a.step]
    if gaps:
        found["every"] = float(statistics.median(gaps))
    return found


def cmd_plan_interval(args: argparse.Namespace) -> int:
    """Young/Daly from measurements: a drill's report, a run's store, or flags."""
    found: dict[str, float] = {}
    if args.report:
        report = load_json_file(args.report, what="drill report")
        measured = report.get("interval", {}).get("measured", {}) if isinstance(report, dict) else {}
        if not isinstance(measured, dict) or not measured:
            raise ConfigError(
                args.report, expected="a drill report (drill.json) with interval measurements", found="none"
            )
        recoveries = [f.get("recovery_s") for f in report.get("faults", []) if f.get("recovery_s") is not None]
        pairs = {
            "save_seconds": measured.get("save_seconds_median"),
            "mtbf_seconds": measured.get("mtbf_seconds"),
            "step_seconds": measured.get("step_seconds"),
            "every": report.get("checkpoint_every"),
            "restart_seconds": sorted(recoveries)[len(recoveries) // 2] if recoveries else None,
        }
        found.update({k: float(v) for k, v in pairs.items() if isinstance(v, int | float)})
    if args.config and not args.store:
        raise ConfigError("--config", expected="--store and --run with it (the run's config)", found=args.config)
    if args.store or args.run:
        if not (args.store and args.run):
            raise ConfigError("--run", expected="--store and --run together", found=f"{args.store!r}, {args.run!r}")
        found.update(_measurements_from_store(args.store, args.run, args.config))
    for flag in ("save_seconds", "mtbf_seconds", "step_seconds", "restart_seconds", "every"):
        value = getattr(args, flag)
        if value is not None:
            found[flag] = value
    for need in ("save_seconds", "mtbf_seconds", "step_seconds"):
        if need not in found:
            raise ConfigError(
                "--" + need.replace("_", "-"),
                expected="a measurement (the flag, --report or --store/--run)",
                found="none",
            )
    every = found.get("every")
    advice = advise(
        save_seconds=found["save_seconds"],
        mtbf_seconds=found["mtbf_seconds"],
        step_seconds=found["step_seconds"],
        current_every=int(every) if every is not None else None,
        restart_seconds=found.get("restart_seconds", 0.0),
    )
    emit(args, {"advice": advice.to_json(), "measurements": found}, "\n".join(advice.lines()))
    return 0
