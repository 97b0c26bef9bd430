"""How a command reports an error (``workers.cli.output``): one line on stderr, one JSON object on
stdout with --json, the traceback with --debug."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.workers.cli.conftest import run


def test_debug_shows_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "ckpt", "verify", str(tmp_path / "r" / "training" / "000000000001"), "--debug")
    assert code == 1 and "Traceback" in err


def test_json_errors_are_one_json_object_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "ckpt", "show", "nope", "--json")
    body = json.loads(out)
    assert code == 2 and body["ok"] is False and body["error"]["type"] == "ReferenceSyntaxError"
    assert body["error"]["exit_code"] == 2 and len(err.strip().splitlines()) == 1
