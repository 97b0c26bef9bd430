"""Workers with a node-local tier on a real Temporal dev server: a worker killed after a local
commit and before its upload; the retry on the same host resumes from the local copy, on
another host from the last durable commit; both runs end bit-identical and durable."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.views import RunSummary
from cairn.checkpoint import latest_committed, list_checkpoints
from cairn.stores import LocalStore
from tests.integration.conftest import TemporalServer, assert_matches_reference, run_input, start_worker_process
from workers.stack.servers import ServerProcess
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration

CRASH_STEP = 20


def _tier_env(tmp_path: Path, tier: str, fault: bool) -> dict[str, str]:
    env = {"CAIRN_LOCAL_TIER": str(tmp_path / tier), "CAIRN_LOCAL_TIER_BYTES": "1GiB"}
    if fault:
        env |= {"CAIRN_FAULT": f"tier-before-upload:{CRASH_STEP}", "CAIRN_FAULT_ONCE": str(tmp_path / "fault-once")}
    return env


async def _crash_then_retry(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path, retry_tier: str
) -> tuple[RunSummary, str]:
    """Worker A (tier ``a``) dies at the local commit of CRASH_STEP; worker B (``retry_tier``)
    finishes the run. Returns the summary and B's log."""
    inp = run_input(tmp_path, total_steps=40, steps_per_segment=15, checkpoint={"every": 5})
    address = temporal_server.address
    first = start_worker_process(address, task_queue, tmp_path / "a.log", env=_tier_env(tmp_path, "a", True))
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        assert first.proc is not None
        for _ in range(600):
            if first.proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert first.proc.poll() is not None, first.log_tail()  # SIGKILLed itself at the crash point
        durable = latest_committed(LocalStore(inp.store), inp.run_id)
        assert durable is None or durable.step < CRASH_STEP  # step 20 exists on A's host only
        env = _tier_env(tmp_path, retry_tier, False)
        second = start_worker_process(address, task_queue, tmp_path / "b.log", env=env)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
        log = (tmp_path / "b.log").read_text()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.steps == 40 and max(summary.attempts) >= 2, summary
    assert summary.durable_checkpoint == summary.checkpoint and summary.durable_step == 40  # flushed at the end
    assert [r.step for r in list_checkpoints(LocalStore(inp.store), inp.run_id)][-1] == 40
    assert_matches_reference(summary, inp.config)  # read from the durable store
    return summary, log


async def test_retry_on_the_same_host_resumes_from_the_local_copy(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    _, log = await _crash_then_retry(client, temporal_server, task_queue, tmp_path, retry_tier="a")
    assert f"restored step {CRASH_STEP} from the local tier" in log, log[-4000:]
    assert re.search(rf"resumed from step {CRASH_STEP} \(.*from the local tier\)", log), log[-4000:]


async def test_retry_on_another_host_resumes_from_the_last_durable_commit(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    _, log = await _crash_then_retry(client, temporal_server, task_queue, tmp_path, retry_tier="b")
    found = re.search(r"restored step (\d+) from the durable store", log)
    if found is not None:  # else nothing had been uploaded yet: a fresh start, recomputed
        assert int(found.group(1)) < CRASH_STEP
    assert "from the local tier" not in log
