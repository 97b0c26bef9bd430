"""A Hugging Face Llama-style model (built from its config, nothing downloaded) trained as an FSDP2
gang on Temporal across two worker nodes (CPU, gloo):

- at 2 ranks (one per node), a rank SIGKILLed mid-segment fails the gang, which is retried whole
  from the last commit and ends on the bits of the uninterrupted 2-rank run;
- the same run started again at 4 ranks (two per node) resumes from that checkpoint and goes on
  within the FSDP contract across world sizes; a rank frozen there (SIGSTOP: the hang twin of the
  kill) fails its gang once its signs of life have stopped for the heartbeat timeout — what a
  dead host costs — not at the 120 s collective timeout, and the retry finishes the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import latest_committed, list_checkpoints
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, gang_ranks, gang_worker
from workflows.training_run import TrainingRun

pytestmark = [pytest.mark.integration, pytest.mark.drill]
pytest.importorskip("transformers")

TOLERANCE = 1e-4
"""The FSDP contract across world sizes (docs/how-to/fsdp.md): the training loss of the run
continued at 4 ranks stays within this relative difference of the straight 2-rank run."""
HEARTBEAT_S = 10


PAGE = REPO / "docs" / "how-to" / "fsdp.md"
SECTION = "## A Hugging Face model as an FSDP gang on Temporal"


def llama_fsdp() -> TrainConfig:
    """The config the docs show (the first JSON block of ``SECTION``): a two-block Llama, each
    decoder layer its own FSDP unit by the model's ``_no_split_modules``."""
    text = PAGE.read_text()
    block = text[text.index(SECTION) :].split("```json\n", 1)[1].split("```", 1)[0]
    return parse_config(json.loads(block))


def straight_run(tmp_path: Path, config: TrainConfig, target: int) -> LocalStore:
    """The uninterrupted 2-rank FSDP run, in a gang of this test's own (no Temporal)."""
    store = tmp_path / "reference"
    store.mkdir()
    body = GangJob(run_id="reference", store=str(store), config=config, target_step=target, checkpoint_every=6)
    gang = Gang(GangSpec(nproc_per_node=2), body, tmp_path / "reference-gang")
    gang.start()
    gang.supervise(on_progress=lambda doc: None, cancelled=lambda: False)
    return LocalStore(store)


def at_step(store: LocalStore, run_id: str, step: int) -> Any:
    return next(r for r in list_checkpoints(store, run_id) if r.step == step)


def run_input(tmp_path: Path, run_id: str, config: TrainConfig, **fields: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": run_id,
        "config": config.to_json(),
        "steps_per_segment": 6,
        "store": str(tmp_path / "store"),
        "checkpoint": {"every": 3},
        "heartbeat_timeout_seconds": HEARTBEAT_S,
        "nodes": ["host-a", "host-b"],
        "throttle_seconds_per_step": 0.2,
        **fields,
    }
    return TrainingRunInput.model_validate(body)


def training_past(tmp_path: Path, step: int) -> bool:
    """A gang of this test is training past ``step`` (its ranks' own progress files)."""
    for path in (tmp_path / "gangs").glob("cairn-gang-*/progress.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("step", -1) >= step:
                return True
    return False


async def signal_a_rank_past(tmp_path: Path, step: int, sig: signal.Signals) -> float:
    """Send ``sig`` to one rank process of the gang training past ``step``; returns the time of
    the signal, once the gang has failed (a worker logged it) and the time that took."""
    deadline = time.monotonic() + 240
    while not (training_past(tmp_path, step) and (ranks := gang_ranks(tmp_path, ranks_only=True))):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    os.kill(ranks[-1], sig)
    sent = time.monotonic()
    before = failures(tmp_path)
    while failures(tmp_path) == before:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    return time.monotonic() - sent


def failures(tmp_path: Path) -> int:
    """Gang node failures the workers have logged so far."""
    logs = [(tmp_path / f"worker-{n}.log") for n in ("host-a", "host-b")]
    return sum(log.read_text().count("failed: GangFailedError") for log in logs if log.exists())


@pytest.mark.timeout(900)
async def test_hf_llama_fsdp_gang_on_two_nodes_survives_a_kill_and_continues_at_four_ranks_through_a_freeze(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    config = llama_fsdp()
    reference = await asyncio.to_thread(straight_run, tmp_path, config, 18)
    run_id = f"llama-fsdp-{uuid.uuid4().hex[:8]}"
    store = LocalStore(tmp_path / "store")
    workers = [gang_worker(temporal_server, task_queue, tmp_path, n) for n in ("host-a", "host-b")]
    try:
        # 2 ranks, one per node; a rank SIGKILLed after the commit at step 3.
        first = run_input(tmp_path, run_id, config, world_size=2, total_steps=12)
        handle = await client.start_workflow(TrainingRun.run, first, id=run_id, task_queue=task_queue)
        killed_s = await signal_a_rank_past(tmp_path, 7, signal.SIGKILL)
        one = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
        # The same run at 4 ranks (two per node); a rank frozen mid-way through its segment.
        second = run_input(tmp_path, run_id, config, world_size=4, total_steps=18)
        handle = await client.start_workflow(TrainingRun.run, second, id=run_id, task_queue=task_queue)
        frozen_s = await signal_a_rank_past(tmp_path, 13, signal.SIGSTOP)
        two = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
    finally:
        for w in workers:
            w.stop()
    logs = "".join((tmp_path / f"worker-{n}.log").read_text() for n in ("host-a", "host-b"))
    assert "node 0 of 2, 1 rank(s) of 2" in logs and "node 1 of 2, 1 rank(s) of 2" in logs
    assert "node 0 of 2, 2 rank(s) of 4" in logs and "node 1 of 2, 2 rank(s) of 4" in logs
    # The kill: the gang retried whole, the same bits as the straight 2-rank run.
    assert one.steps == 12 and one.world_size == 2 and one.retried_segments >= 1
    assert (
        one.fingerprint == read_manifest(reference, at_step(reference, "reference", 12), expect_kind=None).fingerprint
    )
    # The freeze: found by its silence at the heartbeat timeout, the gang retried, no rank left.
    assert "has shown no sign of life" in logs and f"(limit {HEARTBEAT_S} s)" in logs
    assert two.steps == 18 and two.world_size == 4 and two.retried_segments >= 1
    assert gang_ranks(tmp_path) == [], "a rank (the frozen one included) outlived its gang"
    latest = latest_committed(store, run_id)
    assert latest is not None and latest.step == 18
    manifest = read_manifest(store, latest, expect_kind=None)
    assert manifest.writer.ranks == 4 and manifest.meta["runtime"]["sharding"]["world_size"] == 4
    # Across world sizes: the contract, measured at every step of the continued run.
    mine, _ = load_training(store, latest, run_config=config)
    theirs, _ = load_training(reference, at_step(reference, "reference", 18), run_config=config)
    losses = list(zip(mine.history["loss"], theirs.history["loss"], strict=True))
    assert len(losses) == 18 and all(a == b for a, b in losses[:12])  # bit-exact up to the resume
    difference = max(abs(a - b) / abs(b) for a, b in losses[12:])
    print(
        f"gang failed {killed_s:.1f} s after the kill (W=2), {frozen_s:.1f} s after the freeze (W=4); "
        f"W=2 -> W=4 largest relative loss difference {difference:.2e}"
    )
    assert difference < TOLERANCE
