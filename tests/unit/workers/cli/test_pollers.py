"""``run status`` counts a worker as polling only when the server saw it poll within a long poll's
reach: Temporal keeps listing a stopped worker's pollers for minutes (a run whose last worker died
five minutes ago showed ``"workers_polling": 1``)."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.workflowservice.v1 import DescribeTaskQueueResponse

from workers.cli.temporal import LIVE_POLL_SECONDS, pollers_of

NOW = 1_800_000_000.0


def _answer(*ages: float) -> DescribeTaskQueueResponse:
    pollers = []
    for age in ages:
        at = NOW - age
        pollers.append(
            PollerInfo(identity=f"w{age}", last_access_time=Timestamp(seconds=int(at), nanos=int(at % 1 * 1e9)))
        )
    return DescribeTaskQueueResponse(pollers=pollers)


def test_a_worker_seen_within_a_long_poll_is_polling() -> None:
    found = pollers_of(_answer(0.5, 59.0), "q", "activity", NOW)
    assert found.live == 2 and found.last_seen_s is not None and abs(found.last_seen_s - 0.5) < 1e-3


def test_a_stopped_workers_listing_is_not_a_worker() -> None:
    found = pollers_of(_answer(300.0), "q", "workflow", NOW)  # listed five minutes after it stopped
    assert found.live == 0 and found.last_seen_s is not None and round(found.last_seen_s) == 300
    assert pollers_of(_answer(LIVE_POLL_SECONDS + 1), "q", "workflow", NOW).live == 0


def test_a_queue_nobody_ever_polled() -> None:
    found = pollers_of(_answer(), "q", "activity", NOW)
    assert found.live == 0 and found.last_seen_s is None
