"""The ZeRO-1 engine (``cairn.trainers.mlp.zero``) at world size 1 is the single-process trainer, bit
for bit, across a resume."""

from __future__ import annotations

from pathlib import Path

from cairn.distributed.comm import SoloComm
from cairn.gang.job import GangJob
from cairn.gang.rank import run_rank
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from tests.conftest import dist_config


def test_zero_engine_at_world_size_one_equals_the_single_process_trainer(tmp_path: Path) -> None:
    config = dist_config()
    plain = TrainingSession.fresh("r", LocalStore(tmp_path / "plain"), config)
    plain.run(12, checkpoint_every=4)
    job = GangJob(run_id="r", store=str(tmp_path / "zero"), config=config, target_step=8, checkpoint_every=4)
    first = run_rank(SoloComm(), job, tmp_path / "w")
    second = run_rank(SoloComm(), job.model_copy(update={"target_step": 12}), tmp_path / "w")
    assert first.step == 8 and second.resumed_from_step == 8 and second.step == 12
    assert plain.last_commit is not None and second.fingerprint == plain.last_commit.manifest.fingerprint
    assert second.loss == plain.state.history["loss"][-1]
