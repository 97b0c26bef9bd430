"""The user-facing commands against real servers: `cairn dev`, `cairn run`, `cairn ckpt` on s3://."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import ReservationServer, S3Server, TemporalServer, cairn, cli
from workers.stack.servers import free_port

pytestmark = pytest.mark.integration


DEMO_STACK = """
import sys
from pathlib import Path
from workers.demo import dev_stack
from workers.stack.devstack import StackConfig
state, temporal, ui, s3, service = sys.argv[1:]
dev_stack(StackConfig(Path(state), int(temporal), int(ui), int(s3), int(service)))
"""
"""What ``make demo`` does to the stack, on the test's ports and state folder."""


def test_the_demos_stack_has_a_worker_up_is_idempotent_env_matches_and_down_stops_only_its_own(
    tmp_path: Path,
) -> None:
    state, port = tmp_path / "state", {name: free_port() for name in ("temporal", "ui", "s3", "service")}
    ports = [
        "--state-dir", str(state),
        "--temporal-port", str(port["temporal"]), "--ui-port", str(port["ui"]),
        "--s3-port", str(port["s3"]), "--service-port", str(port["service"]),
    ]  # fmt: skip
    pids: dict[str, int] = {}
    # The demo's stack, the `up` that restarts a worker and the `dev down` in processes of their
    # own, as a user runs them: the servers outlive the process that started them, and `down`
    # stops processes that are not its children. `dev status`, `env` and the `up`s that start
    # nothing here.
    try:
        subprocess.run([sys.executable, "-c", DEMO_STACK, str(state), *map(str, port.values())], cwd=REPO, check=True)
        status = json.loads(cli("dev", "status", *ports, "--json").stdout)
        assert all(s["running"] for s in status.values()), status  # the worker too: `make demo` leaves one
        assert "polling 'cairn-training'" in (state / "logs" / "worker.log").read_text()  # up waited for it
        pids = {k: v["pid"] for k, v in status.items()}

        second = cli("dev", "up", *ports)  # finds them all running: starts nothing
        assert second.returncode == 0 and "the stack is already up: nothing started" in second.stdout
        assert second.stdout.count("already running") == 4
        assert {k: v["pid"] for k, v in json.loads(cli("dev", "status", *ports, "--json").stdout).items()} == pids

        # `dev env` prints what `dev up` prints for a worker started by hand: the same export lines
        env_text = cli("dev", "env", *ports).stdout
        exports = [line.strip() for line in second.stdout.splitlines() if line.strip().startswith("export ")]
        assert exports and exports == [line for line in env_text.splitlines() if line.startswith("export ")]
        assert f"export TEMPORAL_ADDRESS=127.0.0.1:{port['temporal']}" in exports
        env_json = cli("dev", "env", *ports, "--json").stdout
        assert len(env_json.strip().splitlines()) == 1  # one JSON document
        up_json = json.loads(cli("dev", "up", *ports, "--json").stdout)
        assert json.loads(env_json)["env"] == up_json["env"] and up_json["already_up"] is True
        assert up_json["web_ui"] == f"http://127.0.0.1:{port['ui']}"

        # A part that died: the next up starts that part only, and says so. With a torch trainer
        # configured, the worker follows the README: one activity at a time, the trainer preloaded.
        os.killpg(pids["worker"], signal.SIGKILL)
        wait_until(lambda: not _alive(pids["worker"]))
        third = cairn("dev", "up", *ports, "--config", str(REPO / "examples" / "digits.json"))  # starts one
        assert third.returncode == 0, third.stderr
        assert third.stdout.count("already running") == 3
        assert f"worker       not running (pid {pids['worker']} is gone): restarted" in third.stdout
        assert "the stack was up but for: worker (restarted)" in third.stdout
        worker = json.loads(cli("dev", "status", *ports, "--json").stdout)["worker"]
        assert worker["running"] and worker["pid"] != pids["worker"]
        pids["worker"] = worker["pid"]
        argv = Path(f"/proc/{worker['pid']}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert b" ".join(argv).endswith(b"--max-activities 1 --preload examples.digits")
        hint = cli("dev", "env", *ports).stdout
        assert "# a worker started by hand: cairn worker --max-activities 1 --preload examples.digits" in hint
        # another configuration while the worker runs: nothing restarted, and up says how to change it
        other = cli("dev", "up", *ports, "--config", str(REPO / "examples" / "config.json")).stdout
        assert "the stack is already up: nothing started" in other and "cairn dev down" in other

        # Point the worker's pid file at a bystander: down must not signal a process it did not start.
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (state / "pids" / "worker.pid").write_text(json.dumps({"pid": bystander.pid, "marker": "x"}))
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


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.05)


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
