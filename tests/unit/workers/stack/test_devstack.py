"""``cairn dev env`` without servers: what a worker started by hand needs, as ``export`` lines a
shell can ``eval`` or as one JSON document, the same as ``dev up`` prints; said to be for a stack
that is not running when none is."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.unit.workers.cli.conftest import run
from workers.stack.devstack import StackConfig, env_lines, stack_env

PORTS = ["--temporal-port", "17001", "--ui-port", "17002", "--s3-port", "17003", "--service-port", "17004"]


def test_dev_env_prints_export_lines_a_shell_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "dev", "env", "--state-dir", str(tmp_path), *PORTS)
    assert code == 0
    lines = out.splitlines()
    assert lines[-1] == "# a worker started by hand: cairn worker"
    exported = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines[:-1])
    assert exported["TEMPORAL_ADDRESS"] == "127.0.0.1:17001"
    assert exported["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:17003"
    assert exported["CAIRN_RESERVATION_URL"] == "http://127.0.0.1:17004"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= exported.keys()
    assert "not running" in err  # said on stderr: stdout stays evaluable


def test_dev_env_json_is_one_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "dev", "env", "--state-dir", str(tmp_path), *PORTS, "--json")
    assert code == 0 and len(out.strip().splitlines()) == 1
    body = json.loads(out)
    cfg = StackConfig(tmp_path, 17001, 17002, 17003, 17004)
    assert body == {
        "env": stack_env(cfg),
        "worker_command": "cairn worker",
        "state_dir": str(tmp_path),
        "running": False,
    }


def test_values_are_quoted_for_the_shell() -> None:
    assert env_lines({"AWS_SECRET_ACCESS_KEY": "a b$c"}, "cairn worker")[0] == "export AWS_SECRET_ACCESS_KEY='a b$c'"
