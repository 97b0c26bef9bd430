"""``cairn drill`` end to end: seeded faults against a real stack, and a verdict that can fail.

One embedded stack (Temporal dev server, SeaweedFS, reservation service) serves every drill of
this module; the drills kill and restart its servers, so it is not the session's shared one.
Each drill has its own run, task queue and workers. The controls run test-only worker modules
(``rng_dropping_worker``, ``keyless_worker``) and must end in FAIL, naming what broke.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import cli
from workers.drills.runner import DrillResult, run_drill
from workers.drills.schedule import DrillSpec
from workers.drills.stack import EmbeddedStack

pytestmark = [pytest.mark.integration, pytest.mark.drill]

EVERY = 5
FAST = {"step_seconds": 0.01, "heartbeat_timeout_seconds": 1.5, "checkpoint_every": EVERY, "steps_per_segment": 100}
"""Short drills for CI: 10 ms steps, a checkpoint every 5, long segments (each boundary costs a
restore), a dead worker noticed within 1.5 s."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    stack = EmbeddedStack.start(tmp_path_factory.mktemp("drill-stack"), web_ui=False, echo=lambda s: None)
    yield stack
    stack.close()


def drill(stack: EmbeddedStack, out: Path, **fields: Any) -> tuple[DrillResult, dict[str, Any]]:
    spec = DrillSpec.model_validate({**FAST, **fields})
    return run_drill(spec, out=out, stack=stack, echo=lambda s: None, progress=False)


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def assert_passed(report: dict[str, Any]) -> None:
    failed = [c for c in report["checks"] if not c["passed"]]
    assert report["passed"] and not failed, report["text"]
    assert report["verdict"] == "PASS"
    for f in report["faults"]:
        assert f["fired_at_s"] is not None and f["recovery_s"] is not None, f


def test_kills_an_upload_kill_and_a_temporal_restart(stack: EmbeddedStack, tmp_path: Path) -> None:
    result, report = drill(
        stack, tmp_path, seed=9, kills=5, targets=["worker-kill", "kill-in-upload", "temporal-restart"]
    )
    kinds = Counter(f["kind"] for f in report["faults"])
    assert kinds == {"worker-kill": 3, "kill-in-upload": 1, "temporal-restart": 1}
    assert_passed(report)
    assert "BIT-IDENTICAL" in checks(report)["state"]["detail"]
    assert "exactly once" in checks(report)["effects"]["detail"]
    upload = next(f for f in report["faults"] if f["kind"] == "kill-in-upload")
    # Killed with its shards written and its manifest unsent: the retry redoes the interval.
    assert upload["estimated_reach"] is not None and upload["estimated_reach"] % EVERY == 0
    assert upload["resumed_from"] == upload["estimated_reach"] - EVERY
    kills = [
        f for f in report["faults"] if f["kind"] in ("worker-kill", "kill-in-upload") and f["detection_s"] is not None
    ]
    assert kills, report["text"]
    for f in kills:
        assert f["recomputed_steps"] <= EVERY
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert (tmp_path / "drill.json").exists() and "VERDICT: PASS" in report["text"]
    advice = report["interval"]["advice"]
    assert advice is not None and advice["current_steps"] == EVERY and advice["optimum_steps"] >= 1


def test_storage_brownouts_and_s3_and_service_restarts(stack: EmbeddedStack, tmp_path: Path) -> None:
    """Storage faults: brown-outs through the fault proxy, the S3 server and the reservation
    service killed and restarted on their data."""
    _, report = drill(
        stack,
        tmp_path,
        seed=3,
        kills=3,
        targets=["storage-brownout", "s3-restart", "service-restart"],
        brownout_rate=0.3,
    )
    assert {f["kind"] for f in report["faults"]} == {"storage-brownout", "s3-restart", "service-restart"}
    assert_passed(report)
    brownout = next(f for f in report["faults"] if f["kind"] == "storage-brownout")
    assert brownout["injected_faults"] > 0, report["text"]
    assert all(f["server_down_s"] is not None for f in report["faults"] if f["kind"].endswith("-restart"))


def test_unsaved_rng_state_fails_and_names_the_field(stack: EmbeddedStack, tmp_path: Path) -> None:
    _, report = drill(
        stack,
        tmp_path,
        seed=5,
        kills=1,
        workers=1,
        steps_per_segment=20,  # several segments: each one restores the last (RNG-less) checkpoint
        targets=["service-restart"],
        worker_module="tests.integration.rng_dropping_worker",
    )
    state = checks(report)["state"]
    assert not report["passed"] and report["verdict"] == "FAIL"
    assert not state["passed"] and "rng" in state["fields"], state
    assert "rng" in state["detail"] and "VERDICT: FAIL" in report["text"] and "state:" in report["text"]


def test_dropped_idempotency_key_reports_the_double_reservation(stack: EmbeddedStack, tmp_path: Path) -> None:
    _, report = drill(
        stack,
        tmp_path,
        seed=1,
        kills=1,
        targets=["kill-after-effect"],
        worker_module="tests.integration.keyless_worker",
    )
    assert [(f["kind"], f["param"]) for f in report["faults"]] == [("kill-after-effect", "reserve")]
    effects = checks(report)["effects"]
    assert not report["passed"] and not effects["passed"], report["text"]
    assert "2 reservations for the run (expected 1)" in effects["detail"]
    assert checks(report)["state"]["passed"]  # training itself was fine: only the effect doubled


def test_a_frozen_worker_costs_what_a_dead_one_costs(stack: EmbeddedStack, tmp_path: Path) -> None:
    """``freeze``: the worker running the segment is SIGSTOPped past the heartbeat timeout, then
    let go on. The segment resumes on the other worker about a heartbeat timeout after the freeze
    (the frontend's keepalive drops the frozen process's polls), and the thawed attempt commits
    nothing: the verdict checks both, with the state and the effects."""
    heartbeat = 3.0  # longer than the dev server's keepalive (1 s + 1 s): the polls are gone first
    _, report = drill(
        stack, tmp_path, seed=4, kills=3, targets=["freeze", "worker-kill"], heartbeat_timeout_seconds=heartbeat
    )
    assert_passed(report)
    freezes = [f for f in report["faults"] if f["kind"] == "freeze"]
    assert freezes, report["text"]
    for f in freezes:
        assert f["zombie_commits"] == [] and f["frozen_s"] >= heartbeat, f
        # Resumed (restored, training) elsewhere: the heartbeat timeout + 2 s, plus the restore.
        assert f["recovery_s"] < heartbeat + 3, report["text"]
        assert f["recomputed_steps"] <= EVERY, f
    assert "BIT-IDENTICAL" in checks(report)["state"]["detail"]


def test_cairn_drill_shows_its_progress_on_stderr_and_one_json_document_on_stdout(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    """``cairn drill --json`` from a pipe (no terminal): a line on stderr per event — each phase,
    the run's step as it trains, each fault fired — and on stdout only its report."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**FAST, "seed": 2, "kills": 1, "targets": ["worker-kill"]}))
    env = {"TEMPORAL_ADDRESS": stack.temporal_address, "CAIRN_RESERVATION_URL": stack.service_url or ""}
    done = cli(
        "drill", "--spec", str(spec), "--stack", "env", "--store", str(tmp_path / "store"),
        "--out", str(tmp_path / "report"), "--json", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1 and json.loads(done.stdout)["passed"] is True
    lines = [line for line in done.stderr.splitlines() if line.startswith("drill [")]
    phases = list(dict.fromkeys(line.split("]")[0].removeprefix("drill [") for line in lines))
    assert phases == ["starting stack", "faulted run", "baseline", "verifying"], done.stderr
    assert any(re.search(r"\] step \d+/\d+, faults fired [01]/1, \d worker", line) for line in lines), done.stderr
    assert any("] fault 1/1 worker-kill: fired at about step " in line for line in lines), done.stderr
