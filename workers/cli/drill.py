"""``cairn drill`` and ``cairn plan-interval``: the command-line side of recovery drills.

Flags (or a JSON file with the same fields, ``--spec``) become a validated ``DrillSpec``; bad input
is one ``ConfigError`` line naming the field, exit 2, before any server starts. The drill itself
is ``workers.drill.run_drill``; the interval arithmetic is ``cairn.interval``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError
from workers.cli.args import add_numerics_arg
from workers.drills.schedule import FAULT_TARGETS, drill_spec

__all__ = ["cmd_drill", "cmd_plan_interval", "register", "register_plan_interval"]


# -- the command ---------------------------------------------------------------------------------
def _targets(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if text.strip() == "all":
        return list(FAULT_TARGETS)
    bad = [n for n in names if n not in FAULT_TARGETS]
    if bad or not names:
        raise ConfigError("--targets", expected="|".join([*FAULT_TARGETS, "all"]), found=text)
    return names


def cmd_drill(args: argparse.Namespace) -> int:
    from workers.cli.main import report_dir, to_json
    from workers.drills.runner import run_drill  # here, not at the top: every `cairn` command builds this parser

    data: dict[str, Any] = {}
    if args.spec:
        from cairn.jsonio import load_json_file

        loaded = load_json_file(args.spec, what="drill file")
        if not isinstance(loaded, dict):
            raise ConfigError(args.spec, expected="a JSON object with DrillSpec fields", found=type(loaded).__name__)
        data.update(loaded)
    for flag, key in (
        ("seed", "seed"),
        ("kills", "kills"),
        ("duration", "duration_seconds"),
        ("workers", "workers"),
        ("stack", "stack"),
        ("store", "store"),
        ("config", "config"),
        ("run", "run"),
        ("checkpoint_every", "checkpoint_every"),
        ("heartbeat_timeout", "heartbeat_timeout_seconds"),
        ("step_seconds", "step_seconds"),
        ("brownout_rate", "brownout_rate"),
        ("worker_module", "worker_module"),
    ):
        value = getattr(args, flag)
        if value is not None:
            data[key] = value
    if args.targets is not None:
        data["targets"] = _targets(args.targets)
    if args.no_ui:
        data["web_ui"] = False
    if data.get("config") and data.get("run"):
        raise ConfigError(
            "--run", expected="either --config or --run, not both", found=f"{data['config']} and {data['run']}"
        )
    for key in ("config", "run"):
        if data.get(key) and not Path(data[key]).is_file():
            raise ConfigError(f"--{key}", expected="an existing file", found=data[key])
    if data.get("store") and not (str(data["store"]).startswith("s3://") or os.path.isabs(str(data["store"]))):
        data["store"] = os.path.abspath(str(data["store"]))
    spec = drill_spec(data, "drill")
    out = report_dir(args.out, "drill")
    echo = (lambda s: print(s, file=sys.stderr)) if args.json else print
    result, report = run_drill(spec, out=out, echo=echo, progress=not args.no_progress)
    if args.json:
        print(to_json(report))
    else:
        print(report["text"])
    return 0 if report["passed"] else 1


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from workers.cli.main import _count

    p = sub.add_parser("drill", help="a recovery drill: kill workers, servers and storage on a seeded schedule")
    common(p)
    p.add_argument("--seed", type=_count, help="seed of the fault schedule (default 1): same seed, same schedule")
    p.add_argument("--kills", type=_count, help="faults in the schedule (default 5)")
    p.add_argument("--duration", type=float, help="seconds of uninterrupted training in the drilled run")
    p.add_argument("--targets", help="comma-separated faults: " + ", ".join(FAULT_TARGETS) + ", or all")
    p.add_argument("--workers", type=_count, help="workers running at once (default 2)")
    p.add_argument("--stack", choices=("embedded", "env"), help="start our own servers (default) or use the env's")
    p.add_argument("--store", help="s3://bucket/prefix or a directory (default: the embedded S3 bucket)")
    p.add_argument("--config", help="trainer config to drill (default examples/config.json)")
    p.add_argument("--run", help="a run input file to drill (its run id, store and effects are replaced)")
    p.add_argument("--spec", help="a JSON file with the drill's fields (flags override it)")
    p.add_argument("--checkpoint-every", type=_count, help="steps between checkpoints (default 10)")
    p.add_argument("--heartbeat-timeout", type=float, help="the run's heartbeat timeout in seconds (default 3)")
    p.add_argument("--step-seconds", type=float, help="pacing per training step (default 0.02)")
    p.add_argument("--brownout-rate", type=float, help="share of storage requests failed during a brown-out")
    p.add_argument("--worker-module", help="python module run as each worker (default workers.worker)")
    p.add_argument("--out", metavar="DIR", help="report folder (default ./cairn-report-drill)")
    p.add_argument("--no-ui", action="store_true", help="embedded Temporal without its Web UI")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    add_numerics_arg(p, "drills (its workers and its reference)")
    p.set_defaults(handler=cmd_drill, exit_hard=True)


# -- plan-interval ---------------------------------------------------------------------------------
def _measurements_from_store(store_url: str, run_id: str) -> dict[str, float]:
    """Seconds per step and the checkpoint interval, from a run's commit times in its store."""
    import statistics

    from cairn.runs.record import run_record
    from workers.cli.main import _store_arg

    record = run_record(_store_arg(store_url, must_exist=True), run_id)
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
    from cairn.interval import advise
    from workers.cli.main import emit

    found: dict[str, float] = {}
    if args.report:
        from cairn.jsonio import load_json_file

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
    if args.store or args.run:
        if not (args.store and args.run):
            raise ConfigError("--run", expected="--store and --run together", found=f"{args.store!r}, {args.run!r}")
        found.update(_measurements_from_store(args.store, args.run))
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


def register_plan_interval(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("plan-interval", help="checkpoint interval advice (Young/Daly) from a run's measurements")
    common(p)
    p.add_argument("--report", metavar="DRILL_JSON", help="a drill's drill.json (save cost, MTBF, step time)")
    p.add_argument("--store", help="a run's store: step time and interval from its commit times (with --run)")
    p.add_argument("--run", help="the run id in --store")
    p.add_argument("--save-seconds", type=float, help="seconds one checkpoint save costs (C)")
    p.add_argument("--mtbf-seconds", type=float, help="mean time between failures in seconds (M)")
    p.add_argument("--step-seconds", type=float, help="seconds per training step")
    p.add_argument("--restart-seconds", type=float, help="detection + restore after a failure (R)")
    p.add_argument("--every", type=_count_arg, help="the run's checkpoint interval in steps")
    p.set_defaults(handler=cmd_plan_interval)


def _count_arg(text: str) -> int:
    from workers.cli.main import _count

    return _count(text)
