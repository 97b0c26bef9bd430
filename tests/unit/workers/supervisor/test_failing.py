"""How the supervisor fails a dead worker process's attempts (``workers.supervisor.failing``):
on a shared queue retryable; on the worker's own queue non-retryable with its last heartbeat,
so the workflow offers the segment to every worker at once; the sticky queue reset first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from temporalio.api.common.v1 import ActivityType, Payloads
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from activities.edge import WORKER_CRASHED
from workers.supervisor.channel import ActivityReport
from workers.supervisor.failing import fail_attempts


class FakeClient:
    namespace = "default"
    data_converter = DataConverter.default

    def __init__(self, heartbeat: dict[str, Any] | None) -> None:
        self.heartbeat = heartbeat
        self.fails: list[ApplicationError] = []
        self.resets: list[tuple[str, str]] = []
        fake = self

        class Service:
            async def reset_sticky_task_queue(self, request: Any, **_: Any) -> None:
                fake.resets.append((request.execution.workflow_id, request.execution.run_id))

        self.workflow_service = Service()

    def get_async_activity_handle(self, *, task_token: bytes) -> Any:
        fake = self

        class Handle:
            async def fail(self, error: ApplicationError, **_: Any) -> None:
                fake.fails.append(error)

        return Handle()

    def get_workflow_handle(self, workflow_id: str, *, run_id: str | None = None) -> Any:
        fake = self

        class Handle:
            async def describe(self) -> Any:
                pending = PendingActivityInfo(activity_type=ActivityType(name="train_segment"))
                if fake.heartbeat is not None:
                    payloads = await fake.data_converter.encode([fake.heartbeat])
                    pending.heartbeat_details.CopyFrom(Payloads(payloads=payloads))
                return SimpleNamespace(raw_description=SimpleNamespace(pending_activities=[pending]))

        return Handle()


def attempt(queue: str) -> ActivityReport:
    return ActivityReport(
        event="started",
        token="QQ==",
        activity_type="train_segment",
        workflow_id="run-x",
        workflow_run_id="r1",
        attempt=1,
        task_queue=queue,
    )


async def test_an_attempt_on_a_shared_queue_is_failed_retryable() -> None:
    client = FakeClient({"step": 40, "attempt": 1})
    outcome = await fail_attempts(client, [attempt("cairn-training~x86-64-v3-abc")], "SIGKILL")  # type: ignore[arg-type]
    [error] = client.fails
    assert outcome.failed and error.type == WORKER_CRASHED and not error.non_retryable and not error.details
    assert client.resets == [("run-x", "r1")]


async def test_an_attempt_on_the_own_queue_is_offered_to_everyone_with_its_reach() -> None:
    client = FakeClient({"step": 40, "reached": 42, "attempt": 1})
    await fail_attempts(client, [attempt("cairn-training~x86-64-v3-abc#w-0123456789ab")], "SIGKILL")  # type: ignore[arg-type]
    [error] = client.fails
    assert error.type == WORKER_CRASHED and error.non_retryable
    assert error.details[0]["reached"] == 42 and error.details[0]["attempt"] == 1
    assert client.resets == [("run-x", "r1")]


async def test_an_own_queue_attempt_without_a_heartbeat_is_still_offered_to_everyone() -> None:
    client = FakeClient(None)
    await fail_attempts(client, [attempt("q#w-0123456789ab")], "SIGKILL")  # type: ignore[arg-type]
    [error] = client.fails
    assert error.non_retryable and not error.details
