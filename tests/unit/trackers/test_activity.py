"""The tracker activity stops before its next sink write once it is cancelled or superseded
(``activities.trackers.stop_reason``), releases the sink, and reports the cancellation only at
its end: nothing is cut halfway."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.tracker_models import TrackInput
from activities.trackers import export_trackers
from cairn.trackers import TensorBoardSink, read_cursor, sink_id
from tests.unit.trackers.conftest import Run


@pytest.mark.parametrize(
    "details",
    [ActivityCancellationDetails(cancel_requested=True), ActivityCancellationDetails(not_found=True)],
    ids=["cancelled", "superseded"],
)
def test_an_export_cancelled_once_it_holds_the_sink_writes_nothing_and_releases_it(
    run: Run, tmp_path: Path, details: ActivityCancellationDetails
) -> None:
    run.train(10)
    sink = TensorBoardSink(tmp_path / "tb")
    name = sink_id(sink.kind, sink.destination())

    def cursor() -> Any:
        return read_cursor(run.store, run.run_id, name, sink.kind, sink.destination())

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=10))
    env.on_heartbeat = lambda *_: env.cancel(details) if cursor().owner else None  # cancelled once it claimed
    inp = TrackInput(
        run_id=run.run_id, store=str(run.store.root), trackers=[{"kind": "tensorboard", "log_dir": str(sink.log_dir)}]
    )
    with pytest.raises(CancelledError):
        env.run(export_trackers, inp)
    assert not sink.run_dir(run.run_id).exists()  # nothing written
    left = cursor()
    assert (left.owner, left.confirmed, left.pending, left.known) == ("", 0, None, True)  # claimed, then released
