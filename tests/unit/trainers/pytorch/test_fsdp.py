"""FSDP's pieces that need no gang (the gangs: tests/integration/test_fsdp.py): the row cut is
``torch.chunk``'s, the config keeps a replicated run's identity, a run may change its strategy
between checkpoints but not its block size, and what FSDP cannot do is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cairn import errors as E
from cairn.checkpoint.options import CheckpointOptions
from cairn.config import DistributedConfig, TrainConfig, parse_config
from cairn.distributed.comm import SoloComm
from cairn.stores import LocalStore
from cairn.trainers.loading import check_config_compatible, load_trainer
from cairn.trainers.pytorch.fsdp import default_fsdp_units, rows_of
from tests.conftest import digits_dp_config


def with_distributed(config: TrainConfig, **distributed: object) -> TrainConfig:
    body = config.to_json()
    body["distributed"].update(distributed)
    return parse_config(body)


@pytest.mark.parametrize("rows", [0, 1, 3, 5, 7, 8, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_rows_are_cut_as_torch_chunk_cuts_them(rows: int, world: int) -> None:
    chunks = [c.shape[0] for c in torch.chunk(torch.empty(rows), world)] if rows else []
    chunks += [0] * (world - len(chunks))
    cut = [rows_of(rows, world, r) for r in range(world)]
    assert [stop - start for start, stop in cut] == chunks
    assert all(cut[r][1] == cut[r + 1][0] or cut[r + 1][0] == cut[r + 1][1] for r in range(world - 1))
    assert sum(stop - start for start, stop in cut) == rows


def test_a_replicated_config_dumps_as_before_fsdp_existed() -> None:
    assert DistributedConfig().model_dump(mode="json") == {"microbatches": 1, "block_bytes": 1 << 20}
    fsdp = DistributedConfig(strategy="fsdp", param_dtype="bfloat16").model_dump(mode="json")
    assert fsdp["strategy"] == "fsdp" and fsdp["param_dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="param_dtype is an fsdp setting"):
        DistributedConfig(param_dtype="bfloat16")


def test_a_run_may_change_its_strategy_between_checkpoints_not_its_blocks() -> None:
    replicated = digits_dp_config()
    check_config_compatible(with_distributed(replicated, strategy="fsdp"), replicated)
    check_config_compatible(replicated, with_distributed(replicated, strategy="fsdp", param_dtype="bfloat16"))
    with pytest.raises(E.IncompatibleConfigError, match="config.distributed.block_bytes"):
        check_config_compatible(with_distributed(replicated, strategy="fsdp", block_bytes=512), replicated)


def test_what_fsdp_cannot_do_is_refused_before_anything_is_sharded(tmp_path: Path) -> None:
    config = with_distributed(digits_dp_config(autocast="bfloat16"), strategy="fsdp")
    trainer = load_trainer(config)
    with pytest.raises(E.ConfigError) as info:
        trainer.data_parallel(SoloComm(), "r", LocalStore(tmp_path), CheckpointOptions())
    assert "trainer.options.autocast" in str(info.value) and "\n" not in str(info.value)
    assert trainer.shards is None  # nothing was sharded


def test_bfloat16_compute_with_batchnorm_is_refused_before_sharding(tmp_path: Path) -> None:
    trainer = load_trainer(with_distributed(digits_dp_config(), strategy="fsdp", param_dtype="bfloat16"))
    with pytest.raises(E.ConfigError, match="distributed.param_dtype") as info:
        trainer.data_parallel(SoloComm(), "r", LocalStore(tmp_path), CheckpointOptions())
    assert "BatchNorm" in str(info.value) and trainer.shards is None


def test_a_collective_failure_is_the_gangs_a_trainer_bug_is_the_trainers() -> None:
    from cairn.trainers.pytorch.fsdp import collective_failure

    assert collective_failure(
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    )
    assert not collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"))
    assert not collective_failure(ValueError("gloo"))


def test_the_default_wrap_policy_is_a_hugging_face_models_blocks() -> None:
    class Block(torch.nn.Linear):
        pass

    class Model(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(2, 2), Block(2, 2)])
            self.head = torch.nn.Linear(2, 1)

    model = Model()
    assert default_fsdp_units(model) == list(model.layers)
    assert default_fsdp_units(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []
