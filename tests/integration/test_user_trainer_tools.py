"""The run tools on a user's own trainer, against real servers: ``cairn drill`` of an epoch-based
run (``total_epochs``) of it passes with all its checks; ``cairn run report`` of a run of it finds
the run's config in the workflow's recorded input and writes its PNGs; ``cairn train`` into a
bucket that does not exist is refused before the first step."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from tests.conftest import REPO
from tests.integration.conftest import S3Server, TemporalServer, cli
from tests.user_trainer import UserModel, installed_user_model, user_config
from workers.drills.runner import run_drill
from workers.drills.schedule import DrillSpec
from workers.drills.stack import DrillStack
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration

MODULE = "user_tools_integration_model"
STEPS_PER_EPOCH = 39


@pytest.fixture
def user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserModel]:
    yield from installed_user_model(tmp_path, monkeypatch, MODULE)


@pytest.mark.drill
def test_drill_of_an_epoch_based_user_trainer_run_passes(
    temporal_server: TemporalServer, tmp_path: Path, user_model: UserModel
) -> None:
    run_file = tmp_path / "run.json"
    run_file.write_text(
        json.dumps(
            {
                "run_id": "mine",
                "config": user_config(user_model.factory),
                "total_epochs": 2,
                "segment": {"epochs": 1},
                "store": str(tmp_path / "unused"),
                "checkpoint": {"every": 10},
                "heartbeat_timeout_seconds": 2,
                "throttle_seconds_per_step": 0.03,
            }
        )
    )
    spec = DrillSpec.model_validate(
        {"run": str(run_file), "kills": 1, "targets": ["worker-kill"], "workers": 1, "store": str(tmp_path / "store")}
    )
    stack = DrillStack(temporal_address=temporal_server.address)  # no S3 and no service: a local store, no effects
    result, report = run_drill(spec, out=tmp_path / "report", stack=stack, echo=lambda s: None, progress=False)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"] and all(c["passed"] for c in checks.values()), report["text"]
    assert set(checks) == {"run", "state", "checkpoints", "uncommitted", "faults"}
    assert result.total_steps == 2 * STEPS_PER_EPOCH and f"{2 * STEPS_PER_EPOCH} steps" in report["text"]
    assert "BIT-IDENTICAL" in checks["state"]["detail"]
    assert checks["checkpoints"]["detail"].startswith("all 3 kept checkpoints verify"), checks["checkpoints"]
    assert report["faults"][0]["recovery_s"] is not None
    assert (tmp_path / "report" / "timeline.png").stat().st_size > 10_000


async def test_run_report_of_a_user_trainer_run_writes_its_pngs(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path, user_model: UserModel
) -> None:
    inp = TrainingRunInput.model_validate(
        {
            "run_id": f"mine-{uuid.uuid4().hex[:8]}",
            "config": user_config(user_model.factory),
            "total_epochs": 1,
            "store": str(tmp_path / "store"),
            "checkpoint": {"every": 13},
            "heartbeat_timeout_seconds": 3,
        }
    )
    async with serving(client, task_queue):
        result = await asyncio.wait_for(
            client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue), timeout=120
        )
    assert RunSummary.model_validate(result).steps == STEPS_PER_EPOCH
    out = tmp_path / "report"
    done = await asyncio.to_thread(
        cli, "run", "report", inp.run_id, "--address", temporal_server.address, "--out", str(out), "--json"
    )
    body = json.loads(done.stdout)
    assert body["steps"] == STEPS_PER_EPOCH and body["evaluations"] == 1 and body["segment_attempts"] == 1
    for name in ("loss_lr.png", "timeline.png", "throughput.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
    # Told another config than the run's own, the report validates against that one: refused, naming both.
    other = tmp_path / "other.json"
    other.write_text(json.dumps(json.loads((REPO / "examples" / "config.json").read_text())))
    refused = await asyncio.to_thread(
        cli, "run", "report", inp.run_id, "--address", temporal_server.address, "--out", str(out), "--config",
        str(other), check=False,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "IncompatibleConfigError: config.trainer.factory: checkpoint was written by another" in refused.stderr
    assert f"found {user_model.factory}" in refused.stderr


def test_a_bucket_that_does_not_exist_is_refused_before_the_first_step(
    seaweedfs: S3Server, user_model: UserModel
) -> None:
    store = f"s3://cairn-no-such-bucket-{uuid.uuid4().hex[:8]}/runs"
    done = cli("train", "--config", str(user_model.config), "--steps", "50", "--store", store,
               "--endpoint-url", seaweedfs.endpoint, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("cairn: error: StoreNotFoundError: store: ")
    assert "checked before training" in done.stderr and "no such bucket" in done.stderr
    assert not user_model.marker.exists()  # the trainer was never asked for a step
