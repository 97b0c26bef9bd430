"""A fleet that mixes CPU generations: two workers whose numpy dispatches differently (one
restricted to what a pre-AVX2 machine runs), one SIGKILLed mid-run. Under a pinned profile the run
ends bit-identical to its uninterrupted reference; unpinned (``native``), the run's segments never
reach the other kind of worker (they wait for one of their own), so no mixed state is ever made."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowHandle

from activities.views import RunSummary
from cairn.checkpoint import latest_committed
from cairn.numerics import PROFILES
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, run_input, start_worker_process
from workers.cli.temporal import segment_view
from workers.stack.servers import ServerProcess
from workflows.training_run import TrainingRun

pytestmark = [pytest.mark.integration, pytest.mark.drill]

CONTROLS = tuple(PROFILES["x86-64-v3"].environment())
RESTRICTED = {"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"}
STEPS = 40


def machine_env(**extra: str) -> dict[str, str]:
    """A worker's environment as its host gives it: none of the test process's pins (pass it
    whole: ``inherit_env=False``, or the test's pins come back)."""
    return {**{k: v for k, v in os.environ.items() if k not in CONTROLS}, **extra}


Reference = Callable[[dict[str, object], str, dict[str, str]], Callable[[], str]]


@pytest.fixture
def reference_fingerprint(tmp_path: Path) -> Iterator[Reference]:
    """Start the uninterrupted reference run (`cairn train`) and get a function that returns its
    fingerprint: it computes while the test's run waits on its workers. A process, not in this
    one: it computes under ``env`` (a host's environment without the test's pins, or a
    restricted CPU), and ``--numerics`` re-execs it under the profile."""
    started: list[subprocess.Popen[str]] = []

    def start(config: dict[str, object], numerics: str, env: dict[str, str]) -> Callable[[], str]:
        path = tmp_path / f"config-{numerics}.json"
        path.write_text(json.dumps(config))
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "train", "--config", str(path), "--steps", str(STEPS),
             "--store", str(tmp_path / f"reference-{numerics}"), "--numerics", numerics, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
        )  # fmt: skip
        started.append(proc)

        def fingerprint() -> str:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err
            return str(json.loads(out)["fingerprint"])

        return fingerprint

    yield start
    for proc in started:
        if proc.poll() is None:  # the test failed before it read the result
            proc.kill()
        proc.communicate()


async def wait_commit(store: LocalStore, run_id: str, at_least: int, proc: ServerProcess) -> int:
    deadline = time.monotonic() + 60
    while True:
        ref = latest_committed(store, run_id)
        if ref is not None and ref.step >= at_least:
            return ref.step
        assert time.monotonic() < deadline, proc.log_tail()
        await asyncio.sleep(0.05)


def kill(proc: ServerProcess) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # a lost machine
    proc.proc.wait(timeout=10)  # type: ignore[union-attr]


async def hand_over(
    client: Client, server: TemporalServer, task_queue: str, tmp_path: Path, inp: Any, procs: list[ServerProcess]
) -> WorkflowHandle[Any, Any]:
    """Start the run on an unrestricted worker (a.log); once it has committed, start a restricted
    worker (b.log) and SIGKILL the first. The workers go into ``procs`` for the caller to stop."""
    flags = ("--numerics", inp.numerics)
    procs.append(
        start_worker_process(
            server.address, task_queue, tmp_path / "a.log", machine_env(), extra=flags, inherit_env=False
        )
    )
    handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    await wait_commit(LocalStore(inp.store), inp.run_id, 10, procs[0])
    restricted = machine_env(**RESTRICTED)
    procs.append(
        start_worker_process(server.address, task_queue, tmp_path / "b.log", restricted, extra=flags, inherit_env=False)
    )
    kill(procs[0])
    return handle


@pytest.mark.parametrize("numerics", ["x86-64-v2", "x86-64-v3"])
async def test_a_mixed_fleet_ends_bit_identical_under_the_runs_profile(
    client: Client,
    temporal_server: TemporalServer,
    task_queue: str,
    tmp_path: Path,
    numerics: str,
    reference_fingerprint: Reference,
) -> None:
    inp = run_input(tmp_path, total_steps=STEPS, steps_per_segment=STEPS, throttle_seconds_per_step=0.04,
                    numerics=numerics)  # fmt: skip
    expected = reference_fingerprint(inp.config.model_dump(mode="json"), numerics, machine_env(**RESTRICTED))
    store = LocalStore(inp.store)
    procs: list[ServerProcess] = []
    try:
        handle = await hand_over(client, temporal_server, task_queue, tmp_path, inp, procs)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        for proc in procs:
            proc.stop()
    assert summary.retried_segments == 1 and summary.steps == STEPS
    assert "resumed from step" in (tmp_path / "b.log").read_text()  # the restricted worker finished it
    assert summary.fingerprint == expected()
    assert summary.checkpoint is not None
    state, _ = load_training(store, latest_committed(store, inp.run_id))  # type: ignore[arg-type]
    assert state.lineage.numerics is not None and state.lineage.numerics.profile == numerics
    assert state.lineage.numerics.mixed == []


async def test_unpinned_segments_wait_for_a_worker_of_their_own_kind(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path, reference_fingerprint: Reference
) -> None:
    """Pinning switched off: the two kinds of worker compute different bits (shown in the unit
    tests), so the restricted one must never take the run over — the run waits until a worker of
    the kind that computed it returns, then ends bit-identical to that kind's reference."""
    inp = run_input(tmp_path, total_steps=STEPS, steps_per_segment=STEPS, throttle_seconds_per_step=0.04,
                    numerics="native")  # fmt: skip
    expected = reference_fingerprint(inp.config.model_dump(mode="json"), "native", machine_env())
    store = LocalStore(inp.store)
    procs: list[ServerProcess] = []
    try:
        handle = await hand_over(client, temporal_server, task_queue, tmp_path, inp, procs)
        stalled_at = latest_committed(store, inp.run_id)
        # The loss is noticed (a heartbeat timeout, 3 s) and the segment's retry is up for grabs...
        deadline = time.monotonic() + 60
        while (view := segment_view(await handle.describe())) is None or view["attempt"] < 2:
            assert time.monotonic() < deadline, view
            await asyncio.sleep(0.05)
        # ... and stays there: the restricted worker, polling all along, is handed nothing.
        await asyncio.sleep(1.5)  # deliberate: the window in which a misrouted retry would be taken
        assert latest_committed(store, inp.run_id) == stalled_at
        assert "segment to step" not in (tmp_path / "b.log").read_text()
        view = segment_view(await handle.describe())
        assert view is not None and view["state"] != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED, view
        procs.append(
            start_worker_process(
                temporal_server.address,
                task_queue,
                tmp_path / "c.log",
                machine_env(),
                extra=("--numerics", "native"),
                inherit_env=False,
            )
        )
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        for proc in procs:
            proc.stop()
    assert "resumed from step" in (tmp_path / "c.log").read_text()
    assert summary.fingerprint == expected()
