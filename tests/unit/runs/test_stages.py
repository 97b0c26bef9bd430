"""Stages and final-test exposures (``cairn.runs.stages``, ``cairn.runs.exposures``): ``init_from``
starts a stage on another run's weights under the stage contract, and every evaluation on the
test split is counted (``cairn eval``, ``cairn ckpt show``) while the checkpoint stays immutable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointRef
from cairn.config import parse_config
from cairn.session import TrainingSession
from tests.conftest import epoch_config
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
