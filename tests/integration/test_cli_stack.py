"""The user-facing commands against real servers: `cairn dev`, `cairn run`, `cairn ckpt` on s3://."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import ReservationServer, S3Server, TemporalServer, cairn, cli
from workers.stack.servers import free_port

pytestmark = pytest.mark.integration


def test_dev_stack_up_is_idempotent_and_down_stops_only_its_own(tmp_path: Path) -> None:
    ports = [
        "--state-dir", str(tmp_path / "state"),
        "--temporal-port", str(free_port()), "--ui-port", str(free_port()),
        "--s3-port", str(free_port()), "--service-port", str(free_port()),
    ]  # fmt: skip
    pids: dict[str, int] = {}
    # The first `dev up` and the `dev down` in processes of their own, as a user runs them: the
    # servers outlive the `up` that started them, and `down` stops processes that are not its
    # children. `dev status` only reads the pid files and /proc: in this process.
    try:
        first = json.loads(cairn("dev", "up", *ports, "--json").stdout)
        status = json.loads(cli("dev", "status", *ports, "--json").stdout)
        assert all(s["running"] for s in status.values()), status
        pids = {k: v["pid"] for k, v in status.items()}
        second = cli("dev", "up", *ports).stdout  # finds them all running: starts nothing, so here too
        assert second.count("already running") == 4  # a second up is a no-op
        assert {k: v["pid"] for k, v in json.loads(cli("dev", "status", *ports, "--json").stdout).items()} == pids
        assert first["web_ui"].startswith("http://127.0.0.1:")
        # Point the worker's pid file at a bystander: down must not signal a process it did not start.
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (tmp_path / "state" / "pids" / "worker.pid").write_text(json.dumps({"pid": bystander.pid, "marker": "x"}))
        cairn("dev", "down", *ports)
        assert bystander.poll() is None  # not ours: left alone
        bystander.kill()
        bystander.wait()
        for name in ("temporal", "seaweedfs", "reservation"):
            assert not _alive(pids[name]), name
        assert cli("dev", "status", *ports, check=False).returncode == 1
    finally:
        if pids.get("worker") and _alive(pids["worker"]):
            os.killpg(pids["worker"], signal.SIGKILL)
        cli("dev", "down", *ports, check=False)  # cleanup only, whatever the test left running


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_run_commands_end_to_end(
    temporal_server: TemporalServer, reservation_service: ReservationServer, tmp_path: Path, task_queue: str
) -> None:
    example = json.loads((REPO / "examples" / "run.json").read_text())
    example.update(
        run_id=f"cli-{uuid.uuid4().hex[:6]}",
        store=str(tmp_path / "store"),
        total_steps=30,
        steps_per_segment=10,
        effects={"service_url": reservation_service.url, "units": 2, "timeout_seconds": 5},
    )
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(example))
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    # The worker in a process of its own (`cairn worker`, terminated at the end); the commands here.
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--task-queue", task_queue],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        done = json.loads(
            cli("run", "start", str(run_file), "--task-queue", task_queue, "--wait", "--json", env=env).stdout
        )
        assert done["status"] == "completed" and done["steps"] == 30
        assert set(done["effects"]) == {"reserve", "publish", "release"}
        rid = example["run_id"]
        status = json.loads(cli("run", "status", rid, "--json", env=env).stdout)
        assert status["status"] == "COMPLETED" and status["step"] == 30 and status["phase"] == "finished"
        result = json.loads(cli("run", "result", rid, "--json", env=env).stdout)
        assert result["checkpoint"] == done["checkpoint"]
        journal = json.loads(cli("run", "journal", rid, "--json", env=env).stdout)
        kinds = [(e["kind"], e["effect"]) for e in journal["entries"]]
        assert kinds == [
            ("intent", "reserve"), ("observation", "reserve"),
            ("intent", "publish"), ("observation", "publish"),
            ("intent", "release"), ("observation", "release"),
        ]  # fmt: skip
        text = cli("run", "journal", rid, env=env).stdout
        assert "reservation-1" in text
        verified = cli("ckpt", "verify", done["checkpoint"], "--json")
        assert json.loads(verified.stdout)["ok"] is True
        missing = cli("run", "status", "no-such-run", env=env, check=False)
        assert missing.returncode == 5 and "TemporalRefusedError" in missing.stderr
        assert len(missing.stderr.strip().splitlines()) == 1
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_ckpt_commands_on_s3(seaweedfs: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"s3://{seaweedfs.bucket}/cli-{uuid.uuid4().hex[:6]}"
    env = {"AWS_ENDPOINT_URL_S3": seaweedfs.endpoint}
    cfg = str(REPO / "examples" / "config.json")
    out: dict[str, Any] = json.loads(
        cli("train", "--config", cfg, "--steps", "12", "--store", store, "--checkpoint-every", "4",
              "--run-id", "s3run", "--json", env=env).stdout
    )  # fmt: skip
    assert out["checkpoint"] == f"{store}/s3run/training/000000000012"
    listed = json.loads(cli("ckpt", "list", store, "--run", "s3run", "--json", env=env).stdout)
    assert [c["step"] for c in listed["checkpoints"]] == [4, 8, 12]
    assert json.loads(cli("ckpt", "show", out["checkpoint"], "--json", env=env).stdout)["cursor"] == 24
    start = f"{store}/s3run/training/000000000004"
    local = str(tmp_path / "local")
    resumed = json.loads(cli("train", "--resume", start, "--steps", "8", "--store", local, "--json", env=env).stdout)
    same = cli("ckpt", "compare", resumed["checkpoint"], out["checkpoint"], env=env)
    assert same.returncode == 0
    gc = json.loads(cli("ckpt", "gc", store, "--run", "s3run", "--keep-last", "1", "--json", env=env).stdout)
    assert [r.rsplit("/", 1)[1] for r in gc["delete"]] == ["000000000004", "000000000008"]
    # The explicit endpoint flag works without the environment variable.
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    flagged = cli("ckpt", "list", store, "--endpoint-url", seaweedfs.endpoint, "--json")
    assert [c["step"] for c in json.loads(flagged.stdout)["checkpoints"]] == [12]
