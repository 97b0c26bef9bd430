"""Each sink holds every committed step exactly once: exported twice, exported again after its
cursor was lost, cut short mid-write and retried (once the killed export's claim ran out) — read back through the
tracker's own reader."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.stores.base import Store
from cairn.trackers import export_committed, read_cursor, sink_id
from cairn.trackers.cursor import cursor_prefix
from tests.unit.trackers.conftest import (
    SHORT_LEASE,
    CutShort,
    Killed,
    Run,
    first_steps,
    loss_all_lr_first,
    once,
    steps_of,
)

KINDS = ("tensorboard", "mlflow", "wandb")
NAMES = ("loss", "lr")


def _forget_cursor(store: Store, run_id: str, sink: Any) -> None:
    prefix = cursor_prefix(run_id, sink_id(sink.kind, sink.destination()))
    store.delete([info.key for info in store.list(prefix)])


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_committed_range_exported_twice_is_there_once(kind: str, run: Run, sinks: dict[str, Any]) -> None:
    sink = sinks[kind]
    run.train(10)
    first = export_committed(run.store, run.run_id, sink)
    again = export_committed(run.store, run.run_id, sink)
    assert (first.points, first.confirmed, again.points, again.reconciled) == (20, 10, 0, False)
    _forget_cursor(run.store, run.run_id, sink)  # no cursor: the sink is asked what it holds
    asked = export_committed(run.store, run.run_id, sink)
    assert (asked.points, asked.reconciled, asked.confirmed) == (0, True, 10)
    once(steps_of(kind, sink, run.run_id), NAMES, 10)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "wandb"])  # W&B: see trackers.md, not covered
def test_a_write_cut_short_is_completed_by_the_retry_each_step_once(kind: str, run: Run, sinks: dict[str, Any]) -> None:
    sink = sinks[kind]
    run.train(10)
    export_committed(run.store, run.run_id, sink)
    run.train(10)  # steps 11..20 committed
    with pytest.raises(Killed):  # 11..14 in the sink
        export_committed(run.store, run.run_id, CutShort(sink, first_steps(4)), lease_seconds=SHORT_LEASE)
    cursor = read_cursor(run.store, run.run_id, sink_id(sink.kind, sink.destination()), sink.kind, {})
    assert (cursor.confirmed, cursor.pending, bool(cursor.owner)) == (10, (10, 20), True)  # still claimed
    retried = export_committed(run.store, run.run_id, sink, lease_seconds=SHORT_LEASE)
    assert (retried.reconciled, retried.points, retried.confirmed) == (True, 12, 20)
    assert retried.waited > 0  # for the killed export's claim to run out
    once(steps_of(kind, sink, run.run_id), NAMES, 20)


def test_an_mlflow_batch_cut_between_metrics_is_completed_per_metric(run: Run, sinks: dict[str, Any]) -> None:
    sink = sinks["mlflow"]
    run.train(10)
    with pytest.raises(Killed):
        export_committed(run.store, run.run_id, CutShort(sink, loss_all_lr_first(3)), lease_seconds=SHORT_LEASE)
    retried = export_committed(run.store, run.run_id, sink, lease_seconds=SHORT_LEASE)
    assert (retried.reconciled, retried.points) == (True, 7)  # lr 4..10 only
    once(steps_of("mlflow", sink, run.run_id), NAMES, 10)


def test_a_tensorboard_block_spans_exports_and_a_crashed_temporary_file_is_never_read(
    run: Run, sinks: dict[str, Any]
) -> None:
    sink = sinks["tensorboard"]
    run.train(5)
    export_committed(run.store, run.run_id, sink)
    before = sorted(p.name for p in sink.run_dir(run.run_id).iterdir())
    (sink.run_dir(run.run_id) / ".cairn-tmp-left-by-a-killed-write").write_bytes(b"half")
    run.train(5)
    export_committed(run.store, run.run_id, sink)
    assert sorted(p.name for p in sink.run_dir(run.run_id).iterdir()) == before  # the same block, rewritten
    once(steps_of("tensorboard", sink, run.run_id), NAMES, 10)


def test_steps_trained_but_not_committed_are_not_exported(run: Run, sinks: dict[str, Any]) -> None:
    run.train(13, commit_at_end=False)  # commits at 5 and 10; 11..13 are lost with the worker
    for kind, sink in sinks.items():
        assert export_committed(run.store, run.run_id, sink).confirmed == 10
        once(steps_of(kind, sink, run.run_id), NAMES, 10)
