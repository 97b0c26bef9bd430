"""A run with committed checkpoints, the trackers' readers (what each sink holds, read back
through the tracker's own reader), and a sink cut short mid-write."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trackers import PointBatch, StepPoints, TrackerSink, offline_steps, wandb_run_id
from tests.conftest import small_config

SHORT_LEASE = 1.0
"""The lease of an export in these tests (seconds): a killed export's claim runs out quickly."""


class Killed(BaseException):
    """The worker died here (not an error any layer would catch)."""


@dataclasses.dataclass
class Run:
    store: LocalStore
    run_id: str
    session: TrainingSession

    def train(self, steps: int, *, every: int = 5, commit_at_end: bool = True) -> None:
        self.session.run(steps, checkpoint_every=every, checkpoint_at_end=commit_at_end)

    def retry(self) -> None:
        """A new attempt: the state of the last commit (uncommitted steps are lost and recomputed)."""
        self.session = TrainingSession.resume_latest(self.run_id, self.store, small_config())


@pytest.fixture
def run(tmp_path: Path) -> Run:
    store = LocalStore(tmp_path / "store")
    return Run(store, "tracked", TrainingSession.fresh("tracked", store, small_config()))


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline, silent, with every file of its own under the test's directory."""
    for name, sub in (("WANDB_CONFIG_DIR", "cfg"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


class CutShort:
    """A sink killed mid-write: ``write`` hands the inner sink only ``keep(batch)``, then dies."""

    def __init__(self, inner: Any, keep: Any) -> None:
        self.inner, self.keep, self.kind = inner, keep, inner.kind

    def destination(self) -> dict[str, str]:
        return dict(self.inner.destination())

    def held(self, run_id: str, names: list[str]) -> Any:
        return self.inner.held(run_id, names)

    def write(self, batch: PointBatch) -> None:
        self.inner.write(dataclasses.replace(batch, points=self.keep(batch.points)))
        raise Killed


def first_steps(n: int) -> Any:
    return lambda points: list(points)[:n]


def loss_all_lr_first(n: int) -> Any:
    """Every step's loss, but lr only for the first ``n`` steps (a batch cut between metrics)."""

    def keep(points: list[StepPoints]) -> list[StepPoints]:
        out = []
        for i, p in enumerate(points):
            values = {k: v for k, v in p.values.items() if k != "lr" or i < n}
            out.append(StepPoints(p.step, values))
        return out

    return keep


# -- reading each tracker back -------------------------------------------------------------------
def tensorboard_steps(log_dir: Path, run_id: str) -> dict[str, list[int]]:
    """Per tag, every step TensorBoard's own EventAccumulator reads from the run's directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir / run_id), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_steps(uri: str, run_id: str, experiment: str = "cairn") -> dict[str, list[int]]:
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # as the sink does for a file: store
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    (found,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`cairn.run_id` = '{run_id}'")
    return {
        key: sorted(m.step for m in client.get_metric_history(found.info.run_id, key)) for key in found.data.metrics
    }


def wandb_steps(directory: Path, run_id: str) -> dict[str, list[int]]:
    """Per metric, every step the offline run files hold (each history record counted)."""
    from wandb.proto import wandb_internal_pb2 as pb

    from cairn.trackers.wandb_sink import _records

    steps: dict[str, list[int]] = collections.defaultdict(list)
    for path in sorted((directory / "wandb").glob(f"offline-run-*/run-{wandb_run_id(run_id)}.wandb")):
        for data in _records(path.read_bytes()):
            record = pb.Record.FromString(data)
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    name = item.key or "/".join(item.nested_key)
                    if not name.startswith("_"):
                        steps[name].append(int(record.history.step.num))
    assert offline_steps(directory, wandb_run_id(run_id)) == {k: max(v) for k, v in steps.items()}
    return dict(steps)


def once(steps: dict[str, list[int]], names: tuple[str, ...], through: int) -> None:
    """Each of ``names`` holds steps 1..through, each exactly once."""
    for name in names:
        assert sorted(steps[name]) == list(range(1, through + 1)), (name, steps[name])


@pytest.fixture
def sinks(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from cairn.trackers import MLflowSink, TensorBoardSink, WandbSink

    made: dict[str, TrackerSink] = {
        "tensorboard": TensorBoardSink(tmp_path / "tb"),
        "mlflow": MLflowSink(f"file:{tmp_path / 'mlruns'}"),
        "wandb": WandbSink("cairn-test", str(tmp_path / "wb")),
    }
    yield made


def steps_of(kind: str, sink: Any, run_id: str) -> dict[str, list[int]]:
    if kind == "tensorboard":
        return tensorboard_steps(sink.log_dir, run_id)
    if kind == "mlflow":
        return mlflow_steps(sink.tracking_uri, run_id)
    return wandb_steps(sink.directory, run_id)
