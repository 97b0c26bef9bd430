"""An MLflow run per Cairn run, fed exactly once per committed step.

The MLflow run is the one tagged ``cairn.run_id=RUN`` in the experiment (the oldest, should a
race have made two), created on the first write. What it holds is asked of MLflow itself: per
metric, the last step of its metric history. Values are logged per metric in step order, so a
batch cut short leaves each metric's history a prefix, and the retry logs only what follows it.
A ``file:`` tracking URI is a local file store (``MLFLOW_ALLOW_FILE_STORE`` is set for it: MLflow
3 refuses file stores without it); ``http(s)://`` is a tracking server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cairn.errors import ConfigError, EffectError, EffectUnavailableError
from cairn.trackers.export import PointBatch
from cairn.trackers.libraries import import_extra

__all__ = ["MLflowSink", "RUN_TAG", "BATCH", "tracking_uri_problem"]

RUN_TAG = "cairn.run_id"
BATCH = 1000
"""Values per ``log_batch`` call (MLflow's own limit)."""
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
REFUSALS = frozenset(
    {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "PERMISSION_DENIED", "UNAUTHENTICATED", "BAD_REQUEST"}
)
"""MLflow error codes that a retry would meet again: refusals, not an unavailable server."""
NEEDED_BY = "the MLflow tracker"


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is not a tracking URI this sink takes (None: it is)."""
    if uri.startswith("file:"):
        path = uri[len("file:") :]
        path = path[2:] if path.startswith("//") else path
        return None if path.startswith("/") else f"a file: URI must name an absolute directory (found {uri!r})"
    if uri.startswith(("http://", "https://")):
        return None
    return f"expected a file:/ABSOLUTE/DIR or http(s):// tracking URI, found {uri!r}"


class MLflowSink:
    kind = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str = "cairn", run_name: str | None = None) -> None:
        problem = tracking_uri_problem(tracking_uri)
        if problem:
            raise ConfigError(problem, field="mlflow.tracking_uri")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        if tracking_uri.startswith("file:"):
            os.environ.setdefault(ALLOW_FILE_STORE, "true")
        tracking = import_extra("mlflow.tracking", "mlflow-skinny", NEEDED_BY)
        self._entities = import_extra("mlflow.entities", "mlflow-skinny", NEEDED_BY)
        self._errors = import_extra("mlflow.exceptions", "mlflow-skinny", NEEDED_BY)
        with self._mapped():
            self._client: Any = tracking.MlflowClient(tracking_uri=tracking_uri)

    def destination(self) -> dict[str, str]:
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment}

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except self._errors.MlflowException as exc:
            code = str(getattr(exc, "error_code", ""))
            kind = EffectError if code in REFUSALS else EffectUnavailableError
            raise kind(f"MLflow {code}: {exc.message}", field=self.tracking_uri) from exc
        except OSError as exc:
            raise EffectUnavailableError(f"MLflow: {exc}", field=self.tracking_uri) from exc

    def _experiment_id(self) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(self.experiment))
        except self._errors.MlflowException:  # created meanwhile by another writer
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return str(found.experiment_id)

    def run_of(self, run_id: str, *, create: bool) -> str | None:
        """The MLflow run id of ``run_id`` (created when ``create`` and there is none)."""
        experiment = self._experiment_id()
        runs = self._client.search_runs([experiment], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=100)
        if runs:
            return str(min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)).info.run_id)
        if not create:
            return None
        run = self._client.create_run(experiment, run_name=self.run_name or run_id, tags={RUN_TAG: run_id})
        return str(run.info.run_id)

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        with self._mapped():
            run = self.run_of(run_id, create=False)
            if run is None:
                return {}
            return {
                name: max((int(m.step) for m in self._client.get_metric_history(run, name)), default=0)
                for name in names
            }

    def write(self, batch: PointBatch) -> None:
        ms = int(batch.wall_time * 1000)
        metrics = [
            self._entities.Metric(key=name, value=value, timestamp=ms, step=point.step)
            for name in sorted({n for p in batch.points for n in p.values})
            for point in batch.points
            if (value := point.values.get(name)) is not None
        ]  # metric by metric, each in step order: a batch cut short leaves prefixes
        with self._mapped():
            run = self.run_of(batch.run_id, create=True)
            for start in range(0, len(metrics), BATCH):
                self._client.log_batch(run, metrics=metrics[start : start + BATCH], synchronous=True)
            if batch.final:
                self._client.set_terminated(run, "FINISHED")
