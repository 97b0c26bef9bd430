"""The device path's parts that every machine can run: the ``device`` option resolved and refused,
batches placed, and host staging (the reused buffers a device state is exported through) forced
onto CPU tensors: a run exported through it resumes bit for bit, reuses its buffers, and an
async save's snapshot never sees a later update. The CUDA runs themselves are in tests/gpu."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cairn import errors as E
from cairn.checkpoint import CheckpointOptions, CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.session import TrainingSession, default_run_id
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer, normalized_config
from cairn.trainers.pytorch.device import HostStaging, place, resolve_device
from cairn.trainers.pytorch.state_io import check_rng_tensor
from cairn.training import load_training
from cairn.training.async_save import AsyncCheckpointer
from tests.conftest import digits_config

pytest.importorskip("sklearn")


def test_the_device_option_is_resolved_or_refused_in_one_line() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "cuda:x", "CUDA"):
        with pytest.raises(E.ConfigError, match="trainer.options.device: expected cpu, cuda or cuda:N"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(E.ConfigError) as info:
            load_trainer(digits_config(device="cuda"))
        assert "trainer.options.device" in str(info.value) and "without one" in str(info.value)


def test_cpu_is_implied_so_cpu_configs_keep_their_form_and_run_id() -> None:
    implied, explicit = normalized_config(digits_config()), normalized_config(digits_config(device="cpu"))
    assert "device" not in implied.trainer.options  # type: ignore[union-attr]
    assert default_run_id(implied) == default_run_id(explicit)
    assert implied.model_dump(mode="json") == explicit.model_dump(mode="json")
    cuda = normalized_config(digits_config(device="cuda:1"))
    assert cuda.trainer.options["device"] == "cuda:1"  # type: ignore[union-attr]
    assert default_run_id(cuda) != default_run_id(implied)


def test_a_gpu_runs_checkpoint_is_read_on_the_host_without_a_gpu() -> None:
    trainer = load_trainer(digits_config(device="cuda"), on_host=True)  # no GPU needed
    assert trainer.device == torch.device("cpu")  # type: ignore[attr-defined]
    specs = trainer.tensor_specs(0, {})
    assert (specs["rng/cuda"].dtype, specs["rng/cuda"].shape) == ("|u1", (16,))
    with pytest.raises(E.ConfigError, match="built on the host to read"):
        trainer.train(trainer.init_state(), 1)


def test_a_cuda_rng_state_is_checked_by_form() -> None:
    good = np.zeros(16, dtype=np.uint8)
    good[:8] = np.frombuffer(np.int64(7).tobytes(), dtype=np.uint8)
    check_rng_tensor("rng/cuda", good, whole=True)
    bad = good.copy()
    bad[8:] = np.frombuffer(np.int64(6).tobytes(), dtype=np.uint8)  # a Philox offset not a multiple of 4
    for wrong in (bad, good[:12]):
        with pytest.raises(E.InvariantError, match="rng/cuda"):
            check_rng_tensor("rng/cuda", wrong, whole=True)


def test_placing_on_the_cpu_copies_nothing() -> None:
    batch = (torch.ones(2), {"y": torch.zeros(3)})
    assert place(batch, torch.device("cpu")) is batch


def test_staging_reuses_one_buffer_per_tensor_and_holds_values_until_the_next_export() -> None:
    staging = HostStaging(pin=False, always=True)
    live = torch.arange(6, dtype=torch.float32)
    first = staging.stage("w", live)
    assert not np.shares_memory(first, live.numpy())
    live += 100  # an update after the export
    assert first.tolist() == [0, 1, 2, 3, 4, 5]
    second = staging.stage("w", live)
    assert np.shares_memory(first, second) and staging.allocations == 1
    assert second.tolist() == [100, 101, 102, 103, 104, 105]
    staging.stage("w", torch.zeros(2, dtype=torch.float32))  # another shape: a new buffer
    assert staging.allocations == 2


def staged(session: TrainingSession) -> TrainingSession:
    session.trainer.staging = HostStaging(pin=False, always=True)  # type: ignore[attr-defined]
    return session


def test_a_run_exported_through_staging_resumes_bit_exact(tmp_path: Path) -> None:
    config = digits_config()
    straight = TrainingSession.fresh("ref", tmp_path / "ref", config)
    straight.run(40, checkpoint_at_end=False)
    at17 = staged(TrainingSession.fresh("run", tmp_path / "run", config)).run(17)
    assert at17 is not None
    resumed = staged(TrainingSession.from_checkpoint(at17.ref, config=config))
    resumed.run(23)
    assert compare_states(resumed.state, straight.state) == []
    staging = resumed.trainer.staging  # type: ignore[attr-defined]
    assert staging.allocations == sum(not n.startswith(("rng/", "history/")) for n in resumed.state.tensors)


def test_an_async_save_of_a_staged_state_is_a_snapshot(tmp_path: Path) -> None:
    config = digits_config()
    session = staged(TrainingSession.fresh("run", tmp_path / "run", config))
    session.run(5, checkpoint_at_end=False)
    expected = session.state.copy()
    saver = AsyncCheckpointer(LocalStore(tmp_path / "async"), "snap", options=CheckpointOptions.from_env())
    handle = saver.save_async(session.state)
    session.run(5, checkpoint_at_end=False)  # re-stages into the same buffers
    ref: CheckpointRef = handle.result(timeout=60).ref
    saver.close()
    saved, _ = load_training(LocalStore(tmp_path / "async"), ref, run_config=config)
    assert compare_states(saved, expected) == []
    assert session.state.step == 10
