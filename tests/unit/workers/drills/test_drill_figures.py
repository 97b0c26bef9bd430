"""A drill's figures are measured: recomputed steps per fault are the step the lost attempt
reached minus the step its retry resumed from (as ``drill.json`` records them), the header names
the heartbeat timeout the run used, and a Web UI link is printed only for a stack that stays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.cli.main import build_parser
from workers.drills.faults import FaultRecord
from workers.drills.observe import WorkerLogs
from workers.drills.runner import Drill, DrillResult
from workers.drills.schedule import DrillSpec
from workers.drills.stack import DrillStack
from workers.reports.drill import timeline_figure, write_report

T0 = 1_800_000_000.0


def kill(index: int, reached: int, resumed: int, estimated: int) -> FaultRecord:
    """A worker kill whose estimate (the clock since the last commit) overshoots what it reached."""
    fired = T0 + 10.0 * index
    return FaultRecord(
        index,
        "worker-kill",
        fired_at=fired,
        step_at_fault=reached,
        committed_at_fault=resumed,
        detected_at=fired + 10.0,
        resumed_at=fired + 10.5,
        resumed_from=resumed,
        reached=reached,
        estimated_reach=estimated,
    )


def result(tmp_path: Path, **fields: Any) -> DrillResult:
    spec = DrillSpec(checkpoint_every=20)  # its heartbeat timeout is the default, 3 s
    base: dict[str, Any] = {
        "spec": spec,
        "schedule": [],
        "run_id": "drill-1-abc",
        "workflow_id": "drill-1-abc",
        "store": str(tmp_path),
        "total_steps": 200,
        "checkpoint_every": 20,
        "t0": T0,
        "finished_at": T0 + 60.0,
        "status": "COMPLETED",
        "summary": None,
        "faults": [kill(1, reached=57, resumed=40, estimated=59), kill(2, reached=45, resumed=40, estimated=59)],
        "samples": [(T0 + 1.0, 5), (T0 + 9.0, 57)],
        "logs": WorkerLogs(),
        "restarts": [],
        "worker_starts": [],
        "web_ui": None,
        "heartbeat_timeout_seconds": 10.0,  # the run file's, not the spec's
    }
    return DrillResult(**{**base, **fields})


def test_recomputed_steps_are_reached_minus_resumed_from_per_fault(tmp_path: Path) -> None:
    res = result(tmp_path)
    assert [f.recomputed for f in res.faults] == [17, 5]
    report = write_report(res, tmp_path)
    saved = json.loads((tmp_path / "drill.json").read_text())
    for fault in saved["faults"]:
        assert fault["recomputed_steps"] == fault["reached"] - fault["resumed_from"]
    rows = [line.split() for line in report["text"].splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [row[-3:] for row in rows] == [["57", "40", "17"], ["45", "40", "5"]]  # reached, resumed, recomputed
    assert saved["interval"]["measured"]["recomputed_steps"] == 22


def test_the_header_shows_the_heartbeat_timeout_the_run_used(tmp_path: Path) -> None:
    report = write_report(result(tmp_path), tmp_path)
    header = report["text"].splitlines()[0]
    assert "heartbeat timeout 10 s" in header and "heartbeat timeout 3 s" not in header
    assert report["heartbeat_timeout_seconds"] == 10.0
    assert "heartbeat timeout 10 s" in timeline_figure(result(tmp_path)).title


def test_no_web_ui_link_unless_the_stack_is_kept(tmp_path: Path) -> None:
    assert "Web UI" not in write_report(result(tmp_path), tmp_path)["text"]
    kept = {
        "temporal": "127.0.0.1:1",
        "s3": "http://127.0.0.1:2",
        "service": "http://127.0.0.1:3",
        "web_ui": "http://127.0.0.1:4",
        "state_dir": "/tmp/x",
        "pids": {},
        "stop": "kill -TERM -- -11 -12",
    }
    link = "http://127.0.0.1:4/namespaces/default/workflows/drill-1-abc"
    text = write_report(result(tmp_path, web_ui=link, extra={"kept_stack": kept}), tmp_path)["text"]
    assert f"Web UI: {link}" in text and "stop it with: kill -TERM -- -11 -12" in text
    stack = DrillStack("127.0.0.1:1", web_ui="http://127.0.0.1:4")
    drill = Drill(DrillSpec(), stack, tmp_path, echo=lambda s: None)
    drill.ui_lasts = False  # the drill deletes its stack on exit: no link
    assert drill._web_ui_link("drill-1-abc") is None
    drill.ui_lasts = True
    assert drill._web_ui_link("drill-1-abc") == link


def test_keep_stack_flag_reaches_the_spec() -> None:
    args = build_parser().parse_args(["drill", "--keep-stack"])
    assert args.keep_stack is True
    assert DrillSpec.model_validate({"keep_stack": True}).keep_stack and not DrillSpec().keep_stack
