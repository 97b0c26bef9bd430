"""External side effects exactly once, on a real dev server and a real (HTTP + SQLite) service."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn import errors as E
from cairn.effects import ReservationClient, load_journal, published_entries
from cairn.stores import LocalStore
from tests.integration.conftest import (
    ReservationServer,
    TemporalServer,
    assert_matches_reference,
    run_input,
    start_worker_process,
    wait_progress,
)
from workers.stack.servers import ServerProcess
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


def effects_input(tmp_path: Path, service: ReservationServer, **overrides: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": f"fx-{uuid.uuid4().hex[:8]}",
        "total_steps": 60,
        "steps_per_segment": 30,
        "throttle_seconds_per_step": 0.03,
        "effects": {"service_url": service.url, "resource": "FILTER-A", "units": 2, "timeout_seconds": 4},
    }
    body.update(overrides)
    return run_input(tmp_path, **body)


# -- the service on its own -----------------------------------------------------------------------
def test_same_key_different_body_is_refused(reservation_service: ReservationServer) -> None:
    svc = ReservationClient(reservation_service.url)
    first = svc.reserve("wf/reserve", "FILTER-A", 2)
    again = svc.reserve("wf/reserve", "FILTER-A", 2)
    assert first.reservation_id == again.reservation_id == "reservation-1" and again.replayed
    with pytest.raises(E.IdempotencyConflictError) as info:
        svc.reserve("wf/reserve", "FILTER-A", 3)
    assert "wf/reserve" in str(info.value)
    assert svc.usage("FILTER-A")["consumed"] == 2


def test_concurrent_duplicates_consume_once(reservation_service: ReservationServer) -> None:
    svc = ReservationClient(reservation_service.url)
    barrier = threading.Barrier(12)

    def call(_: int) -> str:
        barrier.wait()
        return svc.reserve("wf/dup", "FILTER-A", 2).reservation_id

    with ThreadPoolExecutor(12) as pool:
        ids = set(pool.map(call, range(12)))
    assert ids == {"reservation-1"}
    usage = svc.usage("FILTER-A")
    assert usage["consumed"] == 2 and usage["reservations"] == 1


def test_capacity_is_enforced_and_release_is_idempotent(reservation_service: ReservationServer) -> None:
    svc = ReservationClient(reservation_service.url)
    r = svc.reserve("a", "FILTER-A", 8)
    with pytest.raises(E.EffectError, match="InsufficientCapacity"):
        svc.reserve("b", "FILTER-A", 1)
    assert svc.release("rel-a", r.reservation_id).status == "released"
    assert svc.release("rel-a", r.reservation_id).replayed
    assert svc.usage("FILTER-A")["consumed"] == 0


# -- crash between the effect and the activity's completion -----------------------------------------
async def crash_after_effect(
    client: Client,
    temporal: TemporalServer,
    service: ReservationServer,
    tmp_path: Path,
    task_queue: str,
    point: str,
    worker_module: str = "workers.worker",
) -> tuple[TrainingRunInput, Any, dict[str, Any]]:
    """Run with worker A set to crash at ``point``; replace it with worker B; return the
    service usage observed while training, and the summary."""
    inp = effects_input(tmp_path, service)
    env = {"CAIRN_FAULT": f"after-effect-before-complete:{point}", "CAIRN_FAULT_ONCE": str(tmp_path / "crashed")}
    first = start_worker_process(temporal.address, task_queue, tmp_path / "worker-a.log", env=env, module=worker_module)
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        assert first.proc is not None
        await asyncio.get_running_loop().run_in_executor(None, first.proc.wait, 60)  # it crashes itself
        assert (tmp_path / "crashed").exists(), first.log_tail()
        second = start_worker_process(temporal.address, task_queue, tmp_path / "worker-b.log", module=worker_module)
        await wait_progress(handle, lambda p: p["phase"] in ("training", "finished"), timeout=60)
        during = ReservationClient(service.url).usage("FILTER-A")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    return inp, summary, during


def check_reserved_exactly_once(service: ReservationServer, summary: RunSummary, during: dict[str, Any]) -> None:
    assert during["consumed"] == 2, f"service consumed {during['consumed']} units, expected exactly 2"
    reservations = ReservationClient(service.url).reservations()
    assert [r["reservation_id"] for r in reservations] == ["reservation-1"], reservations
    assert summary.effects["reserve"] == "reservation-1"  # the original outcome


@pytest.mark.drill
async def test_seed_scenario_crash_after_reservation(
    client: Client,
    temporal_server: TemporalServer,
    reservation_service: ReservationServer,
    tmp_path: Path,
    task_queue: str,
) -> None:
    inp, summary, during = await crash_after_effect(
        client, temporal_server, reservation_service, tmp_path, task_queue, "reserve"
    )
    check_reserved_exactly_once(reservation_service, summary, during)
    # The pending intent was reconciled by asking the service, not by reserving again.
    journal = load_journal(LocalStore(inp.store), inp.run_id)
    reserve = [e for e in journal.entries if e.effect == "reserve"]
    assert [e.kind for e in reserve] == ["intent", "observation"]
    assert reserve[1].receipt == "reservation-1" and reserve[1].detail.get("reconciled") is True
    assert reserve[0].key == f"{inp.run_id}/reserve"  # workflow id / activity id: no attempt, no run id
    # Released at the end (compensation/cleanup), published once, training bit-exact.
    assert ReservationClient(reservation_service.url).usage("FILTER-A")["consumed"] == 0
    assert len(published_entries(LocalStore(inp.store), inp.run_id)) == 1
    assert_matches_reference(summary, inp.config)


@pytest.mark.drill
async def test_dropping_the_key_makes_the_seed_check_fail(
    client: Client,
    temporal_server: TemporalServer,
    reservation_service: ReservationServer,
    tmp_path: Path,
    task_queue: str,
) -> None:
    """The exactly-once check can fail: without idempotency keys the crash consumes 4 units."""
    _, summary, during = await crash_after_effect(
        client,
        temporal_server,
        reservation_service,
        tmp_path,
        task_queue,
        "reserve",
        worker_module="tests.integration.keyless_worker",
    )
    assert during["consumed"] == 4
    with pytest.raises(AssertionError, match="consumed 4 units"):
        check_reserved_exactly_once(reservation_service, summary, during)


@pytest.mark.drill
async def test_crash_after_publish_publishes_once(
    client: Client,
    temporal_server: TemporalServer,
    reservation_service: ReservationServer,
    tmp_path: Path,
    task_queue: str,
) -> None:
    inp, summary, _ = await crash_after_effect(
        client, temporal_server, reservation_service, tmp_path, task_queue, "publish"
    )
    entries = published_entries(LocalStore(inp.store), inp.run_id)
    assert len(entries) == 1 and entries[0].checkpoint == summary.checkpoint
    assert summary.effects["publish"].startswith(f".cairn/registry/{inp.run_id}/")
    assert_matches_reference(summary, inp.config)


async def test_rollback_does_not_return_reserved_units(
    client: Client, reservation_service: ReservationServer, tmp_path: Path, task_queue: str
) -> None:
    inp = effects_input(tmp_path, reservation_service, retention={"keep_last": 3, "keep_every": 10})
    svc = ReservationClient(reservation_service.url)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_progress(handle, lambda p: p["step"] >= 30)
        await handle.signal(TrainingRun.rollback, 10)
        deadline = time.monotonic() + 30
        while not any(e.kind == "decision" for e in load_journal(LocalStore(inp.store), inp.run_id).entries):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        during = svc.usage("FILTER-A")  # right after the rollback, with 50 steps still to redo
        summary = RunSummary.model_validate(await handle.result())
    journal = load_journal(LocalStore(inp.store), inp.run_id)
    assert during["consumed"] == 2, (during, summary, journal)  # rolled back; the reservation stays held
    [decision] = [e for e in journal.entries if e.kind == "decision"]
    assert decision.effect == "rollback" and decision.detail["to_step"] == 10
    assert "NOT returned" in str(decision.detail["note"]) and decision.detail["reservation"] == "reservation-1"
    assert [r["reservation_id"] for r in svc.reservations()] == ["reservation-1"]
    assert summary.steps == 60
    assert_matches_reference(summary, inp.config)  # deterministic replay after the rollback


async def test_cancel_compensates_by_releasing(
    client: Client, reservation_service: ReservationServer, tmp_path: Path, task_queue: str
) -> None:
    inp = effects_input(tmp_path, reservation_service)
    svc = ReservationClient(reservation_service.url)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_progress(handle, lambda p: p["step"] >= 5)
        assert svc.usage("FILTER-A")["consumed"] == 2
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert svc.usage("FILTER-A")["consumed"] == 0
    journal = load_journal(LocalStore(inp.store), inp.run_id)
    release = [e for e in journal.entries if e.effect == "release" and e.kind == "observation"]
    assert len(release) == 1 and release[0].detail["reason"] == "cancelled"
    assert published_entries(LocalStore(inp.store), inp.run_id) == []  # nothing published
