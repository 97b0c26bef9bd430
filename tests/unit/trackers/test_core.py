"""The committed history as points, a sink's cursor, the run input's tracker specs, the missing
extra, and ``cairn trackers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from activities.tracker_models import TrackInput
from cairn.errors import MissingExtraError
from cairn.stores import MemoryStore
from cairn.trackers import CommittedHistory, committed_history, read_cursor
from cairn.trackers.cursor import KEEP, TrackerCursor, append_cursor, cursor_prefix
from cairn.trackers.libraries import import_extra
from tests.unit.trackers.conftest import Run, once, tensorboard_steps


def test_points_put_each_update_at_its_step_and_each_evaluation_at_its_val_step() -> None:
    history = {"loss": [3.0, 2.0, 1.0], "lr": [0.1, 0.1, 0.2], "val_step": [2.0], "val_loss": [1.5]}
    committed = CommittedHistory("r", 3, "ckpt", 0.0, history)
    points = committed.points(after=1)
    assert [(p.step, p.values) for p in points] == [
        (2, {"loss": 2.0, "lr": 0.1, "val_loss": 1.5}),
        (3, {"loss": 1.0, "lr": 0.2}),
    ]
    held = committed.points(after=0, held={"loss": 2, "lr": 3})  # what a sink holds is not sent again
    assert [(p.step, p.values) for p in held] == [(2, {"val_loss": 1.5}), (3, {"loss": 1.0})]
    assert committed.names() == ["loss", "lr", "val_loss"]


def test_the_committed_history_is_the_latest_commits(run: Run) -> None:
    assert committed_history(run.store, run.run_id) is None
    run.train(7, commit_at_end=False)
    found = committed_history(run.store, run.run_id)
    assert found is not None and (found.step, len(found.history["loss"])) == (5, 5)


def test_a_cursor_never_moves_back_and_keeps_a_few_entries() -> None:
    store = MemoryStore("cursor-test")
    cursor: TrackerCursor | None = TrackerCursor(sink="s", kind="tensorboard")
    for step in (5, 10, 3, 12):  # a stale writer's 3 does not move it back
        assert cursor is not None
        cursor = append_cursor(store, "r", cursor, confirmed=step, pending=None)
    assert cursor is not None and read_cursor(store, "r", "s", "tensorboard", {}).confirmed == 12
    pending = append_cursor(store, "r", cursor, confirmed=12, pending=(12, 20))
    assert pending is not None and (pending.confirmed, pending.pending) == (12, (12, 20))
    assert append_cursor(store, "r", cursor, confirmed=20) is None  # not the latest entry: read again
    assert len(list(store.list(cursor_prefix("r", "s")))) == KEEP


def test_a_missing_tracker_library_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'cairn-train\[trackers\]'"):
        import_extra("no_such_tracker_library", "tensorboard", "the TensorBoard tracker")


def test_tracker_specs_are_refused_one_line_per_bad_field() -> None:
    bad = [
        {"kind": "tensorboard", "log_dir": "relative"},
        {"kind": "mlflow", "tracking_uri": "ftp://x"},
        {"kind": "wandb", "project": "p", "dir": "/w", "mode": "sometimes"},
        {"kind": "comet"},
    ]
    with pytest.raises(ValidationError) as err:
        TrackInput(run_id="r", store="/s", trackers=bad)  # type: ignore[arg-type]
    fields = sorted(".".join(str(x) for x in e["loc"]) for e in err.value.errors())
    assert fields == [
        "trackers.0.tensorboard.log_dir",
        "trackers.1.mlflow.tracking_uri",
        "trackers.2.wandb.mode",
        "trackers.3",
    ]


def test_cairn_trackers_exports_an_in_process_run_once_however_often_it_runs(
    run: Run, tmp_path: Path, capsys: Any
) -> None:
    from workers.cli.main import main

    run.train(10)
    argv = ["trackers", str(run.store.root), run.run_id, "--tensorboard", str(tmp_path / "tb"), "--json"]
    assert main(argv) == 0
    assert main(argv) == 0
    assert '"confirmed": 10' in capsys.readouterr().out
    once(tensorboard_steps(tmp_path / "tb", run.run_id), ("loss", "lr"), 10)
