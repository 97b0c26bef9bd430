"""``cairn plan-interval``: the advice from flags, and from a drill report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cli.main import main


def test_plan_interval_from_flags_and_from_a_drill_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        main(["plan-interval", "--save-seconds", "2", "--mtbf-seconds", "3600", "--step-seconds", "0.5", "--json"]) == 0
    )
    advice = json.loads(capsys.readouterr().out)["advice"]
    assert advice["optimum_seconds"] == pytest.approx(120.0) and advice["optimum_steps"] == 240
    report = {
        "checkpoint_every": 10,
        "interval": {"measured": {"save_seconds_median": 0.1, "mtbf_seconds": 20.0, "step_seconds": 0.02}},
        "faults": [{"recovery_s": 3.0}, {"recovery_s": 5.0}],
    }
    (tmp_path / "drill.json").write_text(json.dumps(report))
    assert main(["plan-interval", "--report", str(tmp_path / "drill.json"), "--mtbf-seconds", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measurements"]["mtbf_seconds"] == 40.0 and out["advice"]["current_steps"] == 10
    assert out["advice"]["restart_seconds"] == 5.0
    assert main(["plan-interval", "--step-seconds", "1"]) == 2
    assert "--save-seconds" in capsys.readouterr().err
