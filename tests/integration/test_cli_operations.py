"""What an operator meets: status with no worker, a workflow id already running, a worker with
Temporal down, Ctrl-C of a worker and of `run watch`, and what a worker logs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, cairn, cli
from workers.stack.servers import free_port

pytestmark = pytest.mark.integration


def run_file(tmp_path: Path, **changes: object) -> Path:
    body = json.loads((REPO / "examples" / "run.json").read_text())
    body.update(run_id=f"ops-{uuid.uuid4().hex[:6]}", store=str(tmp_path / "store"), **changes)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(body))
    return path


def cli_worker(task_queue: str, env: dict[str, str], out: IO[str] | None = None) -> subprocess.Popen[str]:
    """`cairn worker` in its own process, its output to ``out`` (default: discarded). A process,
    not :func:`cli`: it is signalled and killed, serves metrics and sets up its own logging."""
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--task-queue", task_queue],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=out if out is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if out is not None else subprocess.DEVNULL,
        text=True,
    )


def connected_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an established TCP connection to local port ``port``."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                inodes.add(f"socket:[{fields[9]}]")
    links = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            links.add(os.readlink(fd))
    return bool(inodes & links)


def test_status_without_a_worker_and_a_duplicate_start(
    temporal_server: TemporalServer, tmp_path: Path, task_queue: str
) -> None:
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path = run_file(tmp_path)
    rid = json.loads(path.read_text())["run_id"]
    started = json.loads(cli("run", "start", str(path), "--task-queue", task_queue, "--json", env=env).stdout)
    assert started["workflow_id"] == rid and started["store"] == str(tmp_path / "store")
    asked = time.monotonic()
    status = cli("run", "status", rid, env=env)  # no worker polls this queue
    assert time.monotonic() - asked < 30  # answers without a worker, instead of waiting for one
    assert status.returncode == 0 and f"{rid}: RUNNING" in status.stdout
    assert "no worker is polling" in status.stdout and "None" not in status.stdout
    as_json = json.loads(cli("run", "status", rid, "--json", env=env).stdout)
    assert as_json["status"] == "RUNNING" and as_json["workers_polling"] == 0
    again = cli("run", "start", str(path), "--task-queue", task_queue, env=env, check=False)
    assert again.returncode == 5 and "already running" in again.stderr and "Traceback" not in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    # Ctrl-C of `run watch` stops watching, not the run. A process of its own: the signal is the point.
    watch = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "run", "watch", rid],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(temporal_server.address.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while not connected_to(watch.pid, port):  # watching: past the interpreter's start, talking to Temporal
            assert watch.poll() is None, watch.communicate()
            assert time.monotonic() < deadline, "`cairn run watch` did not connect to Temporal"
            time.sleep(0.05)
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 130 and "the run keeps going" in err and "Traceback" not in err, err
    assert json.loads(cli("run", "status", rid, "--json", env=env).stdout)["status"] == "RUNNING"
    worker = cli_worker(task_queue, env)
    try:
        assert cli("run", "cancel", rid, env=env).returncode == 0
        deadline = time.monotonic() + 60
        while (closed := json.loads(cli("run", "status", rid, "--json", env=env).stdout))["status"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert closed["status"] == "CANCELED"
    text = cli("run", "status", rid, env=env).stdout
    assert "CANCELED" in text and "failed" not in text.lower(), text


def test_worker_with_temporal_down_is_one_line() -> None:
    # A process: `cairn worker` sets up logging, signal handlers and a metrics endpoint for its own.
    down = cairn("worker", "--address", f"127.0.0.1:{free_port()}", check=False, timeout=60)
    assert down.returncode == 5, down.stderr
    lines = [line for line in down.stderr.strip().splitlines() if "cairn: error" in line]
    assert len(lines) == 1 and "TemporalUnavailableError" in lines[0] and "Traceback" not in down.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_worker_stops_cleanly_and_logs_what_training_does(
    temporal_server: TemporalServer, tmp_path: Path, task_queue: str, sig: signal.Signals
) -> None:
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path = run_file(
        tmp_path, total_steps=200, steps_per_segment=200, throttle_seconds_per_step=0.02, checkpoint={"every": 10}
    )
    rid = json.loads(path.read_text())["run_id"]
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = cli_worker(task_queue, env, out)
        try:
            cli("run", "start", str(path), "--task-queue", task_queue, env=env)
            deadline = time.monotonic() + 60
            while "committed step 20" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            worker.send_signal(sig)
            worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
            cli("run", "cancel", rid, env=env, check=False)
    text = log.read_text()
    assert worker.returncode == 0, text
    for line in ("segment to step 200, attempt 1", "resumed from step 0", "committed step 10", "handed back at step"):
        assert line in text, (line, text)
    assert "Traceback" not in text and "WARNING" not in text and "Fatal Python error" not in text, text
    assert "Found credentials" not in text  # boto3's discovery chatter stays out


def _scrape(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def test_metrics_endpoint_and_json_logs(temporal_server: TemporalServer, tmp_path: Path, task_queue: str) -> None:
    """A worker serves Cairn's metrics and the SDK's on one Prometheus endpoint, with sane values
    after a run; with CAIRN_LOG_FORMAT=json every line is a JSON object naming run, workflow,
    step and attempt."""
    port = free_port()
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "CAIRN_METRICS_PORT": str(port), "CAIRN_LOG_FORMAT": "json"}
    path = run_file(
        tmp_path, total_steps=30, steps_per_segment=10, checkpoint={"every": 5}, throttle_seconds_per_step=0.05
    )
    rid = json.loads(path.read_text())["run_id"]
    log = tmp_path / "worker.log"
    url = f"http://127.0.0.1:{port}/metrics"
    with log.open("w") as out:
        worker = cli_worker(task_queue, env, out)
        try:
            cli("run", "start", str(path), "--task-queue", task_queue, env=env)
            deadline = time.monotonic() + 60
            while True:  # scraped during the run: steps climb before the run is over
                try:
                    during = _scrape(url).get("cairn_training_steps_total", 0)
                except OSError:
                    during = 0
                if 0 < during < 30:
                    break
                assert time.monotonic() < deadline and during < 30, during
                time.sleep(0.1)
            done = json.loads(cli("run", "result", rid, "--json", env=env).stdout)
            assert done["status"] == "completed" and done["steps"] == 30
            metrics = _scrape(url)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    assert metrics["cairn_training_steps_total"] == 30
    assert metrics["cairn_segments_total{outcome=completed}"] == 3
    assert metrics["cairn_checkpoint_commits_total{outcome=created}"] == 7  # steps 0, 5, ..., 30
    assert metrics["cairn_checkpoint_save_seconds_count"] == 7 and metrics["cairn_checkpoint_save_seconds_sum"] > 0
    assert metrics["cairn_checkpoint_bytes_count"] == 7 and metrics["cairn_checkpoint_bytes_sum"] > 7 * 1000
    # one restore: the first segment; the next two continued from the worker's memory (warm)
    assert metrics["cairn_checkpoint_restore_seconds_count"] == 1
    assert metrics["cairn_segment_starts_total{path=cold}"] == 1
    assert metrics["cairn_segment_starts_total{path=warm}"] == 2
    assert metrics["cairn_warm_runs"] == 1 and metrics["cairn_warm_state_bytes"] > 1000
    assert metrics.get("cairn_recoveries_total", 0) == 0 and metrics.get("cairn_checkpoint_conflicts_total", 0) == 0
    assert any(name.startswith("temporal_") for name in metrics), sorted(metrics)[:20]  # the SDK's own
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert records and all(
        {"ts", "level", "message", "run_id", "workflow_id", "step", "attempt"} <= set(r) for r in records
    )
    commits = [r for r in records if r["message"].startswith(f"run {rid}: committed step")]
    assert len(commits) == 7 and all(r["run_id"] == rid and r["workflow_id"] == rid for r in commits)
    assert all(isinstance(r["step"], int) and r["attempt"] == 1 for r in commits)
    non_json = [line for line in log.read_text().splitlines() if line and not line.startswith("{")]
    assert all(line.startswith("cairn worker:") for line in non_json), non_json


def test_run_report_and_list(temporal_server: TemporalServer, tmp_path: Path, task_queue: str) -> None:
    """`cairn run report` draws the run from its store and Temporal's history (an interruption
    marked on the timeline); `cairn run list` lists it with its status."""
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path = run_file(tmp_path, total_steps=90, steps_per_segment=60, throttle_seconds_per_step=0.05,
                    checkpoint={"every": 10})  # fmt: skip
    rid = json.loads(path.read_text())["run_id"]
    worker = cli_worker(task_queue, env)
    try:
        cli("run", "start", str(path), "--task-queue", task_queue, env=env)
        first_commit = tmp_path / "store" / rid / "training" / f"{10:012d}" / "manifest.json"
        deadline = time.monotonic() + 60
        while not first_commit.exists():  # the first segment is underway, 2.5 s of it left
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cli("run", "checkpoint", rid, env=env)  # an interruption: checkpoint now, carry on
        done = json.loads(cli("run", "result", rid, "--json", env=env).stdout)
        assert done["status"] == "completed"
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    out = tmp_path / "report"
    report = json.loads(cli("run", "report", rid, "--out", str(out), "--json", env=env).stdout)
    assert report["steps"] == 90 and report["interruptions"] == 1 and report["failures"] == 0
    assert all((out / name).stat().st_size > 5000 for name in ("loss_lr.png", "timeline.png", "throughput.png"))
    listed = json.loads(cli("run", "list", "--json", env=env).stdout)["runs"]
    mine = [r for r in listed if r["workflow_id"] == rid]
    assert len(mine) == 1 and mine[0]["status"] == "COMPLETED" and mine[0]["step"] == mine[0]["total"] == 90
    assert rid in cli("run", "list", env=env).stdout
