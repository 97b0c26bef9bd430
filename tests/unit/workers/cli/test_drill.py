"""``cairn drill`` refuses bad input (one line, exit 2) before it starts anything: no servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cli.main import main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--targets", "worker-kill,meteor"], "--targets: expected worker-kill|kill-in-upload|"),
        (["--kills", "0"], "kills"),
        (["--seed", "x"], "--seed"),
        (["--config", "/nonexistent/config.json"], "--config: expected an existing file"),
        (["--store", "/tmp/drill-store", "--targets", "kill-in-upload"], "--targets: expected an s3:// store"),
        (["--stack", "env", "--targets", "temporal-restart"], "TEMPORAL_ADDRESS"),
    ],
)
def test_cairn_drill_bad_input_is_one_line_exit_2(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    code = main(["drill", *argv, "--out", str(tmp_path / "out"), "--json"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("cairn: error: ") and named in line, err
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert error["exit_code"] == 2 and error["type"] in ("ConfigError", "UsageError")
