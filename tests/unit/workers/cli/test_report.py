"""``cairn report``: PNGs and a summary from the store alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.workers.cli.conftest import CONFIG, run


def test_report_from_the_store_writes_pngs_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    code, _, _ = run(capsys, "train", "--config", CONFIG, "--steps", "60", "--store", store, "--run-id", "rep",
                     "--checkpoint-every", "10")  # fmt: skip
    assert code == 0
    out = tmp_path / "report"
    code, text, _ = run(capsys, "report", store, "rep", "--out", str(out), "--json")
    body = json.loads(text)
    assert code == 0 and body["steps"] == 60 and body["committed_checkpoints"] == 6
    assert body["final_loss"] is not None and body["final_loss"] < body["min_loss"] + 1
    for name in ("loss_lr.png", "timeline.png", "throughput.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name
    assert "60 steps" in (out / "summary.txt").read_text()
    code, _, err = run(capsys, "report", store, "nope", "--out", str(out))
    assert code == 2 and "nope" in err
