"""The language-model example (examples/lm.py: a byte-level GPT on a resumable stream, bf16
autocast, clipping, accumulation) trained durably: on Temporal with a worker SIGKILLed mid-epoch,
and as a gang of W = 2 rank processes; both end on the bits of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.manifest import CheckpointKind
from cairn.config import parse_config
from cairn.distributed.comm import SoloComm
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec
from cairn.gang.rank import run_rank
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.integration.conftest import TemporalServer, killed_mid_epoch
from tests.unit.trainers.pytorch.test_models import lm_config

pytestmark = pytest.mark.integration


@pytest.mark.drill
async def test_lm_on_temporal_survives_a_sigkill_mid_epoch_bit_identical(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    config = lm_config(eval_every=None)
    summary, inp, per_epoch, expected = await killed_mid_epoch(
        client, temporal_server, task_queue, tmp_path, config, "lm"
    )
    assert summary.steps == summary.total_steps == 2 * per_epoch
    assert summary.attempts[0] >= 2 and summary.recomputed_steps <= inp.checkpoint.every
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref, run_config=config)
    assert compare_states(state, expected.state) == []
    assert expected.last_commit is not None and manifest.fingerprint == expected.last_commit.manifest.fingerprint
    assert state.history["val_step"] == [float(per_epoch), float(2 * per_epoch)]
    assert 0.0 <= state.history["val_accuracy"][-1] <= 1.0


def test_lm_gang_of_two_is_accumulation_in_one_process_bit_for_bit(tmp_path: Path) -> None:
    """W = 2 ranks, 4 microbatches (each rank draws the stream's whole batch, computes two) ==
    ``accumulation: 4`` in one process, clipping and bf16 autocast included."""
    body = lm_config(accumulation=1, eval_every=3).to_json()
    body["distributed"] = {"microbatches": 4, "block_bytes": 4096}
    gang_config = parse_config(body)
    store = tmp_path / "store"
    store.mkdir()
    job = GangJob(run_id="lm", store=str(store), config=gang_config, target_step=6, checkpoint_every=3)
    g = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "w2")
    g.start()
    result = g.supervise(on_progress=lambda doc: None, cancelled=lambda: False)
    assert (result.world_size, result.step) == (2, 6)
    (tmp_path / "solo").mkdir()
    solo = job.model_copy(update={"store": str(tmp_path / "solo")})
    run_rank(SoloComm(), solo, tmp_path / "w1")
    gang_store, solo_store = LocalStore(store), LocalStore(tmp_path / "solo")
    ganged, manifest = load_training(
        gang_store, CheckpointRef(gang_store.url, "lm", CheckpointKind.TRAINING, 6), run_config=gang_config
    )
    _, solo_manifest = load_training(
        solo_store, CheckpointRef(solo_store.url, "lm", CheckpointKind.TRAINING, 6), run_config=gang_config
    )
    assert manifest.fingerprint == solo_manifest.fingerprint
    accumulated = TrainingSession.fresh("a", tmp_path / "a", lm_config(eval_every=3))
    accumulated.run(6, checkpoint_at_end=False)
    for name, arr in accumulated.state.tensors.items():
        assert arr.tobytes() == ganged.tensors[name].tobytes(), name
    assert ganged.history["val_loss"] == accumulated.state.history["val_loss"]
