"""Stages and final-test exposures (``cairn.trainers.stages``, ``cairn.checkpoint.exposures``): ``init_from``
starts a stage on another run's weights under the stage contract, and every evaluation on the
test split is counted (``cairn eval``, ``cairn ckpt show``) while the checkpoint stays immutable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointRef
from cairn.config import parse_config
from cairn.session import TrainingSession
from tests.conftest import dist_config, epoch_config, rewrite_manifest, small_config
from workers.cli.main import main as cli


def test_init_from_starts_a_stage_and_test_exposures_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = epoch_config()
    store = tmp_path / "store"
    first = TrainingSession.fresh("stage1", store, base)
    done = first.run(20)
    assert done is not None
    body = base.model_dump(mode="json")
    body["stage"] = "finetune"
    body["optimizer"]["lr"] = 0.001
    body["init_from"] = {"checkpoint": str(done.ref)}
    stage2 = TrainingSession.fresh("stage2", store, parse_config(body))
    state = stage2.state
    assert state.step == 0 and state.lineage.reference is not None
    assert state.lineage.reference.fingerprint == done.manifest.fingerprint
    assert state.lineage.reference.may_change == ["data", "init_from", "optimizer", "stage"]
    assert np.array_equal(state.params["W1"], first.state.params["W1"])  # the weights came along...
    assert not state.m["W1"].any() and state.rng_state == stage2.trainer.init_state().rng_state  # ...nothing else
    stage2_done = stage2.run(5)
    assert stage2_done is not None

    body["seed"] = 99  # the stage contract does not allow a new seed
    with pytest.raises(E.IncompatibleConfigError, match="stage contract") as info:
        TrainingSession.fresh("stage3", store, parse_config(body))
    assert info.value.field == "config.seed"

    ckpt = str(stage2_done.ref)
    assert cli(["eval", ckpt, "--split", "val", "--json"]) == 0
    assert cli(["eval", ckpt, "--split", "test", "--json"]) == 0
    one = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert one["final_test_exposures"] == 1 and "warning" not in one
    assert cli(["eval", ckpt, "--split", "test", "--json"]) == 0
    out = capsys.readouterr()
    two = json.loads(out.out.splitlines()[-1])
    assert two["final_test_exposures"] == 2 and "evaluated 2 times" in out.err
    assert cli(["ckpt", "show", ckpt]) == 0
    shown = capsys.readouterr()
    assert "final-test exposures 2" in shown.out and "reference" in shown.out and "warning" in shown.err
    # The checkpoint itself stayed immutable: its fingerprint still verifies.
    assert cli(["ckpt", "verify", ckpt]) == 0
    capsys.readouterr()
    assert CheckpointRef.parse(ckpt) == stage2_done.ref


def _file_config(path: Path) -> dict[str, object]:
    body = small_config().model_dump(mode="json")
    body["data"] = {"source": "file", "path": str(path), "n_features": 8, "n_classes": 3, "version": "file-v1"}
    return body


def test_the_stages_config_builds_the_references_trainer(tmp_path: Path) -> None:
    """The reference is read with a trainer built from the new stage's config, never from its own:
    a reference whose data the contract lets change is not opened (here its file is gone), only its
    weights are read, checked against this stage's model."""
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.standard_normal((64, 8)), y=rng.integers(0, 3, 64))
    store = tmp_path / "store"
    base = TrainingSession.fresh("base", store, parse_config(_file_config(data)))
    done = base.run(4)
    assert done is not None
    data.unlink()
    body = small_config().model_dump(mode="json")
    body.update(stage="finetune", init_from={"checkpoint": str(done.ref)})  # may_change: data (the default)
    stage = TrainingSession.fresh("stage", store, parse_config(body))
    assert stage.state.lineage.reference is not None
    assert stage.state.lineage.reference.fingerprint == done.manifest.fingerprint
    assert np.array_equal(stage.state.params["W1"], base.state.params["W1"])
    assert stage.state.lineage.dataset_hash == stage.trainer.data_hash  # this stage's data, not the reference's


def test_a_reference_differing_outside_the_contract_is_refused_naming_the_field(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = TrainingSession.fresh("base", store, small_config()).run(2)
    assert done is not None
    body = small_config().model_dump(mode="json")
    body["model"]["hidden"] = 4
    body.update(stage="finetune", init_from={"checkpoint": str(done.ref)})
    with pytest.raises(E.IncompatibleConfigError, match="stage contract") as info:
        TrainingSession.fresh("stage", store, parse_config(body))
    assert (info.value.field, info.value.expected, info.value.found) == ("config.model.hidden", 16, 4)


def test_weights_that_do_not_fit_the_stages_model_are_refused_before_they_are_read(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = TrainingSession.fresh("base", store, small_config()).run(2)
    assert done is not None
    body = small_config().model_dump(mode="json")
    body["data"]["n_features"] = 6  # data may change; this model's first layer then has another shape
    body.update(stage="finetune", init_from={"checkpoint": str(done.ref)})
    for shard in store.rglob("*.bin"):
        shard.write_bytes(b"\0" * shard.stat().st_size)  # never read: the shapes refuse it first
    with pytest.raises(E.TensorSpecError, match="init_from") as info:
        TrainingSession.fresh("stage", store, parse_config(body))
    assert "W1" in str(info.value.field)


@pytest.mark.parametrize("data", [{}, {"n_examples": 300}], ids=["same-run", "new-data"])
def test_a_stage_starts_from_a_distributed_runs_blocked_checkpoint(tmp_path: Path, data: dict[str, object]) -> None:
    """Validated completely (the same run's config) or by its weights alone (new data), a blocked
    checkpoint's weights arrive whole."""
    store = tmp_path / "store"
    base = TrainingSession.fresh("base", store, dist_config())
    done = base.run(3)
    assert done is not None
    body = dist_config().model_dump(mode="json")
    body["data"].update(data)
    body.update(stage="finetune", init_from={"checkpoint": str(done.ref)})
    stage = TrainingSession.fresh("stage", store, parse_config(body))
    weights = [n for n in stage.state.tensors if stage.trainer.is_weight(n)]
    assert weights and all(np.array_equal(stage.state.tensors[n], base.state.tensors[n]) for n in weights)
    assert stage.run(2) is not None


def test_a_reference_of_the_same_run_config_is_validated_completely(tmp_path: Path) -> None:
    """Where the reference agrees with the stage on every identity field, it is checked as a resume
    would be: here its lineage names other data (refingerprinted, so the rule itself must refuse)."""
    store = tmp_path / "store"
    session = TrainingSession.fresh("base", store, small_config())
    done = session.run(2)
    assert done is not None

    def other_data(body: dict[str, Any]) -> None:
        body["lineage"]["dataset_hash"] = "sha256:" + "0" * 64

    rewrite_manifest(session.store, done.ref, other_data)
    body = small_config().model_dump(mode="json")
    body.update(stage="finetune", init_from={"checkpoint": str(done.ref)})
    with pytest.raises(E.IncompatibleConfigError, match="different data") as info:
        TrainingSession.fresh("stage", store, parse_config(body))
    assert info.value.field == "lineage.dataset_hash"
