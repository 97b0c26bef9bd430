"""``cairn drill``: a recovery drill from flags or a JSON file (``--spec``), validated as a
``DrillSpec`` before any server starts (bad input: one ``ConfigError`` line naming the field,
exit 2); the drill itself is ``workers.drills.runner.run_drill``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError
from cairn.jsonio import load_json_file
from workers.cli.args import Common, add_numerics_arg, count
from workers.cli.output import report_dir, to_json
from workers.drills.schedule import FAULT_TARGETS, drill_spec

__all__ = ["cmd_drill", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("drill", help="a recovery drill: kill workers, servers and storage on a seeded schedule")
    common(p)
    p.add_argument("--seed", type=count, help="seed of the fault schedule (default 1): same seed, same schedule")
    p.add_argument("--kills", type=count, help="faults in the schedule (default 5)")
    p.add_argument("--duration", type=float, help="seconds of uninterrupted training in the drilled run")
    p.add_argument("--targets", help="comma-separated faults: " + ", ".join(FAULT_TARGETS) + ", or all")
    p.add_argument("--workers", type=count, help="workers running at once (default 2)")
    p.add_argument("--stack", choices=("embedded", "env"), help="start our own servers (default) or use the env's")
    p.add_argument("--store", help="s3://bucket/prefix or a directory (default: the embedded S3 bucket)")
    p.add_argument("--config", help="trainer config to drill (default examples/config.json)")
    p.add_argument("--run", help="a run input file to drill (its run id, store and effects are replaced)")
    p.add_argument("--spec", help="a JSON file with the drill's fields (flags override it)")
    p.add_argument("--checkpoint-every", type=count, help="steps between checkpoints (default 10)")
    p.add_argument("--heartbeat-timeout", type=float, help="the run's heartbeat timeout in seconds (default 3)")
    p.add_argument("--step-seconds", type=float, help="pacing per training step (default 0.02)")
    p.add_argument("--brownout-rate", type=float, help="share of storage requests failed during a brown-out")
    p.add_argument("--worker-module", help="python module run as each worker (default workers.worker)")
    p.add_argument("--out", metavar="DIR", help="report folder (default ./cairn-report-drill)")
    p.add_argument("--no-ui", action="store_true", help="embedded Temporal without its Web UI")
    p.add_argument(
        "--keep-stack",
        action="store_true",
        help="leave the embedded stack running after the drill; prints its Web UI link and how to stop it",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="print no progress on stderr (by default: each phase, the run's step, each fault fired; "
        "one refreshing line on a terminal)",
    )
    add_numerics_arg(p, "drills (its workers and its reference)")
    p.set_defaults(handler=cmd_drill, exit_hard=True)


def _targets(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if text.strip() == "all":
        return list(FAULT_TARGETS)
    bad = [n for n in names if n not in FAULT_TARGETS]
    if bad or not names:
        raise ConfigError("--targets", expected="|".join([*FAULT_TARGETS, "all"]), found=text)
    return names


def cmd_drill(args: argparse.Namespace) -> int:
    from workers.drills.runner import run_drill  # here, not at the top: every `cairn` command builds this parser

    data: dict[str, Any] = {}
    if args.spec:
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
    if args.keep_stack:
        data["keep_stack"] = True
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
