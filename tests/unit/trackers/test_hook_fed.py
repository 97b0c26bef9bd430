"""Why trackers are fed from the committed history and not from a training hook: a segment
killed after uncommitted steps is retried from its last commit and recomputes them, so a
hook-fed tracker logs them twice. The same run fed from committed history holds each once."""

from __future__ import annotations

from typing import Any

from cairn.state import TrainState
from cairn.trackers import MLflowSink, PointBatch, StepPoints, TensorBoardSink, export_committed
from tests.unit.trackers.conftest import Run, mlflow_steps, once, steps_of


def _hook(sink: Any, run_id: str) -> Any:
    """A tracker fed per step by the training loop: what the issue warns against."""

    def on_step(state: TrainState) -> bool:
        point = StepPoints(state.step, {"loss": state.history["loss"][-1]})
        sink.write(PointBatch(run_id, [point], 0.0))
        return False

    return on_step


def _killed_after_13_and_retried(run: Run, hook: Any = None) -> None:
    run.session.run(13, checkpoint_every=5, checkpoint_at_end=False, on_step=hook)  # killed at 13: 11..13 lost
    run.retry()  # from the commit at 10
    run.session.run(10, checkpoint_every=5, on_step=hook)  # 11..20, 11..13 recomputed


def test_a_hook_fed_tracker_logs_the_recomputed_steps_twice(run: Run, tmp_path: Any) -> None:
    hooked = MLflowSink(f"file:{tmp_path / 'hooked'}")
    _killed_after_13_and_retried(run, _hook(hooked, run.run_id))
    steps = mlflow_steps(hooked.tracking_uri, run.run_id)["loss"]
    assert len(steps) == 23
    assert [s for s in range(1, 21) if steps.count(s) > 1] == [11, 12, 13]


def test_a_hook_fed_tensorboard_file_holds_the_recomputed_steps_twice(run: Run, tmp_path: Any) -> None:
    hooked = TensorBoardSink(tmp_path / "hooked-tb")
    _killed_after_13_and_retried(run, _hook(hooked, run.run_id))
    (block,) = hooked.run_dir(run.run_id).iterdir()
    steps = hooked.steps_in(block)
    assert [s for s in range(1, 21) if steps.count(s) > 1] == [11, 12, 13]


def test_fed_from_committed_history_each_step_is_there_once(run: Run, sinks: dict[str, Any]) -> None:
    run.session.run(13, checkpoint_every=5, checkpoint_at_end=False)
    for sink in sinks.values():
        export_committed(run.store, run.run_id, sink)  # after the killed segment: through 10
    run.retry()
    run.session.run(10, checkpoint_every=5)
    for sink in sinks.values():
        export_committed(run.store, run.run_id, sink, final=True)
    once(mlflow_steps(sinks["mlflow"].tracking_uri, run.run_id), ("loss", "lr"), 20)
    for kind in ("tensorboard", "wandb"):
        once(steps_of(kind, sinks[kind], run.run_id), ("loss", "lr"), 20)
