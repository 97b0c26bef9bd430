"""The PyTorch adapter: the seed fixture on a real nn.Module (digits CNN with BatchNorm and dropout,
AdamW, a cosine schedule), resume in a fresh process, exact batches mid-epoch, refused imports."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cairn import errors as E
from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig, parse_config
from cairn.sampler import EpochSampler
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch.trainer import TorchSetup, TorchTrainer
from cairn.training import load_training
from tests.conftest import REPO, digits_config, rewrite_manifest, write_broken
from workers.cli.main import main as cli


@pytest.fixture(scope="module")
def config() -> TrainConfig:
    return digits_config()


@pytest.fixture(scope="module")
def uninterrupted(config: TrainConfig, tmp_path_factory: pytest.TempPathFactory) -> TrainingSession:
    session = TrainingSession.fresh("reference", tmp_path_factory.mktemp("ref"), config)
    session.run(40, checkpoint_at_end=False)
    return session


RESUME_IN_FRESH_PROCESS = """
import sys
from cairn.checkpoint import CheckpointRef
from cairn.config import load_config
from cairn.session import TrainingSession
session = TrainingSession.from_checkpoint(CheckpointRef.parse(sys.argv[1]), config=load_config(sys.argv[2]))
print(session.run(23).ref)
"""


def test_seed_fixture_resumes_bit_exact_in_a_fresh_process(
    config: TrainConfig, uninterrupted: TrainingSession, tmp_path: Path
) -> None:
    """17 updates, checkpoint, restore in a fresh process, 23 more == 40 uninterrupted: every
    parameter, buffer, optimizer tensor, param group, scheduler state, RNG state and the cursor."""
    first = TrainingSession.fresh("run", tmp_path / "store", config)
    at17 = first.run(17)
    assert at17 is not None
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config.to_json()))
    out = subprocess.run(
        [sys.executable, "-c", RESUME_IN_FRESH_PROCESS, str(at17.ref), str(config_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    ref = CheckpointRef.parse(out.stdout.strip())
    resumed, manifest = load_training(LocalStore(tmp_path / "store"), ref)
    assert resumed.step == 40
    assert compare_states(resumed, uninterrupted.state) == []
    names = set(resumed.tensors)
    assert {
        "rng/torch",
        "rng/numpy",
        "buffer/features.1.running_mean",
        "buffer/features.1.num_batches_tracked",
    } <= names
    assert any(n.startswith("optim/") and n.endswith("/exp_avg_sq") for n in names)
    assert resumed.meta["scheduler"]["last_epoch"] == 40
    assert resumed.meta["data"] == {"epoch": 1, "position": 1, "steps_per_epoch": 39}  # 1259 // 32 per epoch
    assert manifest.lineage is not None and manifest.lineage.reproducibility == "bit-exact"
    assert manifest.lineage.trainer == "examples.digits:DigitsCNN" and manifest.lineage.model_hash


def test_the_comparison_can_fail_weights_only_diverges(
    config: TrainConfig, uninterrupted: TrainingSession, tmp_path: Path
) -> None:
    at17 = TrainingSession.fresh("run", tmp_path / "s", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w", config=config, weights_only_restore=True)
    full = TrainingSession.from_checkpoint(at17.ref, run_id="f", config=config)
    weights.run(1, checkpoint_at_end=False)
    full.run(1, checkpoint_at_end=False)
    diverged = {d.field for d in compare_states(weights.state, full.state)}
    assert {"param.head.3.weight", "t", "cursor"} <= diverged  # the very next update differs


def test_resume_mid_epoch_draws_the_same_batches(
    config: TrainConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compare the sample indices, not only the loss."""
    drawn: list[tuple[int, tuple[int, ...]]] = []
    original = EpochSampler.batch

    def recording(self: EpochSampler, step: int) -> np.ndarray:
        idx = original(self, step)
        drawn.append((step, tuple(int(i) for i in idx)))
        return idx

    monkeypatch.setattr(EpochSampler, "batch", recording)
    straight = TrainingSession.fresh("a", tmp_path / "a", config)
    straight.run(50, checkpoint_at_end=False)
    reference = dict(drawn)
    drawn.clear()
    first = TrainingSession.fresh("b", tmp_path / "b", config)
    first.run(20)  # mid-epoch (39 steps per epoch)
    TrainingSession.resume_latest("b", tmp_path / "b", config).run(30, checkpoint_at_end=False)
    resumed = dict(drawn)
    assert resumed == reference and len(resumed) == 50
    epoch0 = [i for step in range(39) for i in reference[step]]
    assert len(epoch0) == len(set(epoch0)) == 39 * 32  # without replacement within an epoch


def forge(arrays: dict[str, np.ndarray], how: str) -> None:
    """A well-formed checkpoint (valid checksums and fingerprint) of a state that is not this model's."""
    if how == "missing-optimizer-tensor":
        del arrays["optim/head.3.weight/exp_avg"]
    elif how == "wrong-dtype":
        arrays["param/head.3.bias"] = arrays["param/head.3.bias"].astype(np.float64)
    elif how == "another-architecture":
        arrays["param/head.3.weight"] = np.ascontiguousarray(arrays["param/head.3.weight"].T)


@pytest.mark.parametrize(
    ("how", "error", "field"),
    [
        ("missing-optimizer-tensor", E.TensorSpecError, "tensors"),
        ("wrong-dtype", E.TensorSpecError, "tensors[param/head.3.bias].dtype"),
        ("another-architecture", E.TensorSpecError, "tensors[param/head.3.weight].shape"),
    ],
)
def test_corrupt_or_incompatible_imports_are_refused_before_state_is_replaced(
    config: TrainConfig, tmp_path: Path, how: str, error: type[E.CairnError], field: str
) -> None:
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    session.run(5)
    ref = write_broken(session.store, "forged", session.state.copy(), tensors=lambda arrays: forge(arrays, how))
    before = session.state.copy()
    with pytest.raises(error) as info:
        session.restore(ref)
    assert info.value.field == field
    assert compare_states(session.state, before) == []


def test_forged_optimizer_settings_are_refused(config: TrainConfig, tmp_path: Path) -> None:
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    saved = session.run(5)
    assert saved is not None

    def drop_setting(body: dict[str, Any]) -> None:
        del body["meta"]["optimizer"]["param_groups"][0]["weight_decay"]

    rewrite_manifest(session.store, saved.ref, drop_setting)
    with pytest.raises(E.InvariantError) as info:
        session.restore(saved.ref)
    assert info.value.field == "meta.optimizer.param_groups[0]"


def test_a_checkpoint_of_another_model_config_is_refused(config: TrainConfig, tmp_path: Path) -> None:
    saved = TrainingSession.fresh("run", tmp_path / "s", config).run(3)
    assert saved is not None
    other = TrainingSession.fresh("other", tmp_path / "o", digits_config(channels=6))
    with pytest.raises(E.IncompatibleConfigError) as info:
        other.restore(saved.ref)
    assert info.value.field == "config.trainer.options.channels"


def test_save_writes_from_zero_copy_views(config: TrainConfig, tmp_path: Path) -> None:
    trainer = load_trainer(config)
    state = trainer.train(trainer.init_state(), 2)
    weight = trainer.params["head.3.weight"]  # type: ignore[attr-defined]
    assert np.shares_memory(state.tensors["param/head.3.weight"], weight.detach().numpy())
    assert not state.tensors["param/head.3.weight"].flags.owndata


def test_tolerance_contract_is_recorded_and_compare_accepts_tolerances(
    config: TrainConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_trainer(digits_config(deterministic=False)).reproducibility == "tolerance"
    assert load_trainer(config).reproducibility == "bit-exact"
    session = TrainingSession.fresh("a", tmp_path / "s", config)
    a = session.run(4)
    assert a is not None

    def nudge(arrays: dict[str, np.ndarray]) -> None:  # what another device's kernels might give
        arrays["param/head.3.weight"] = arrays["param/head.3.weight"] + np.float32(1e-6)

    b = write_broken(session.store, "b", session.state.copy(), tensors=nudge)
    assert cli(["ckpt", "compare", str(a.ref), str(b), "--json"]) == 1
    exact = json.loads(capsys.readouterr().out)
    assert exact["contract"] == "bit-exact"
    assert [d["field"] for d in exact["differences"]] == ["param.head.3.weight"]
    assert cli(["ckpt", "compare", str(a.ref), str(b), "--atol", "1e-5", "--json"]) == 0
    tolerant = json.loads(capsys.readouterr().out)
    assert tolerant["identical"] and tolerant["contract"] == "tolerance rtol=0 atol=1e-05"
    assert cli(["ckpt", "compare", str(a.ref), str(b), "--atol", "1e-8", "--json"]) == 1  # beyond it: reported
    capsys.readouterr()
    assert cli(["ckpt", "compare", str(a.ref), str(b), "--rtol", "nan"]) == 2


def test_shipped_examples_validate() -> None:
    from activities.inputs import TrainingRunInput

    inp = TrainingRunInput.model_validate_json((REPO / "examples" / "digits-run.json").read_text())
    assert inp.total_epochs == 6 and inp.segment is not None and inp.segment.epochs == 1
    trainer = load_trainer(inp.config)
    assert trainer.steps_per_epoch == 39 and trainer.eval_history


def test_async_save_of_a_torch_state_equals_sync(config: TrainConfig, tmp_path: Path) -> None:
    """The async snapshot is taken before the next update mutates the live tensors."""
    sync = TrainingSession.fresh("sync", tmp_path / "a", config)
    sync.run(12, checkpoint_every=4)
    background = TrainingSession.fresh("async", tmp_path / "b", config)
    background.run(12, checkpoint_every=4, async_save=True)
    for step in (4, 8, 12):
        a, _ = load_training(
            LocalStore(tmp_path / "a"), CheckpointRef.parse(f"{tmp_path / 'a'}/sync/training/{step:012d}")
        )
        b, _ = load_training(
            LocalStore(tmp_path / "b"), CheckpointRef.parse(f"{tmp_path / 'b'}/async/training/{step:012d}")
        )
        assert compare_states(a, b) == [], step


def _forge_meta(state: Any, how: str) -> tuple[dict[str, Any], Callable[[dict[str, np.ndarray]], None] | None]:
    meta = copy.deepcopy(state.meta)
    tensors: Callable[[dict[str, np.ndarray]], None] | None = None
    if how == "no-optimizer-state":
        meta["optimizer"]["with_state"] = []

        def tensors(arrays: dict[str, np.ndarray]) -> None:
            for name in [n for n in arrays if n.startswith("optim/")]:
                del arrays[name]

    elif how == "scheduler-base-lrs":
        meta["scheduler"]["base_lrs"] = [10.0]
    elif how == "scheduler-shadows-a-method":
        meta["scheduler"]["step"] = 5
    elif how == "param-group-type":
        meta["optimizer"]["param_groups"][0]["lr"] = "fast"
    elif how == "param-group-betas":
        meta["optimizer"]["param_groups"][0]["betas"] = [0.9, 0.999, 0.5]
    elif how == "scalar-over-a-tensor":
        name = meta["optimizer"]["with_state"][0]
        meta["optimizer"]["scalars"] = {name: {"exp_avg": 3}}
    elif how == "negative-second-moment":

        def tensors(arrays: dict[str, np.ndarray]) -> None:
            arrays["optim/head.3.bias/exp_avg_sq"] = -np.abs(arrays["optim/head.3.bias/exp_avg_sq"]) - 1

    elif how == "evaluations-missing":

        def tensors(arrays: dict[str, np.ndarray]) -> None:
            for key in ("val_step", "val_loss", "val_accuracy"):
                arrays[f"history/{key}"] = np.zeros(0)

    return meta, tensors


@pytest.mark.parametrize(
    ("how", "error", "field"),
    [
        ("no-optimizer-state", E.InvariantError, "meta.optimizer.with_state"),
        ("scheduler-base-lrs", E.InvariantError, "meta.scheduler.base_lrs[0]"),
        ("scheduler-shadows-a-method", E.InvariantError, "meta.scheduler"),
        ("param-group-type", E.InvariantError, "meta.optimizer.param_groups[0].lr"),
        ("param-group-betas", E.InvariantError, "meta.optimizer.param_groups[0].betas"),
        ("scalar-over-a-tensor", E.InvariantError, None),
        ("negative-second-moment", E.InvariantError, "tensors[optim/head.3.bias/exp_avg_sq]"),
        ("evaluations-missing", E.InvariantError, "tensors[history/val_step].shape"),
    ],
)
def test_forged_trainer_state_is_refused_before_it_replaces_anything(
    config: TrainConfig, tmp_path: Path, how: str, error: type[E.CairnError], field: str | None
) -> None:
    """Well-formed checkpoints (valid checksums and fingerprint) whose JSON state would resume
    wrong or crash: each refused with a typed error, the session untouched."""
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    session.run(45)  # past the first epoch end: one evaluation in the history
    meta, tensors = _forge_meta(session.state, how)
    ref = write_broken(session.store, f"forged-{how}", session.state.copy(), tensors=tensors, meta=meta)
    before = session.state.copy()
    with pytest.raises(error) as info:
        session.restore(ref)
    if field is not None:
        assert info.value.field == field
    else:
        assert str(info.value.field).startswith("meta.optimizer.scalars")
    assert compare_states(session.state, before) == []


class FailingBuild(TorchTrainer):
    def build(self) -> TorchSetup:
        raise FileNotFoundError("/data/train.npz")


class CrashingForward(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Linear(3, 2)  # the data has 4 features: the forward pass raises
        return TorchSetup(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            train=(torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)),
        )


def own_trainer(name: str, **options: Any) -> TrainConfig:
    return parse_config({"batch_size": 4, "trainer": {"factory": f"{__name__}:{name}", "options": options}})


def test_user_code_failures_are_typed_and_not_retryable(tmp_path: Path) -> None:
    with pytest.raises(E.TrainerCodeError, match=r"build\(\) raised FileNotFoundError: /data/train.npz") as info:
        load_trainer(own_trainer("FailingBuild"))
    assert not info.value.retryable
    session = TrainingSession.fresh("crash", tmp_path / "s", own_trainer("CrashingForward"))
    with pytest.raises(E.TrainerCodeError, match="update 1 raised RuntimeError"):
        session.run(2)


def test_code_between_updates_cannot_perturb_the_runs_random_streams(
    config: TrainConfig, uninterrupted: TrainingSession, tmp_path: Path
) -> None:
    """The adapter trains from private RNG states: a save's retry jitter (botocore draws from
    ``random``) or any other code touching the global generators between updates changes nothing."""
    import random

    def meddle(_state: Any) -> bool:
        random.random()
        np.random.rand()
        torch.rand(1)
        return False

    meddled = TrainingSession.fresh("meddled", tmp_path / "s", config)
    meddled.run(40, on_step=meddle, checkpoint_at_end=False)
    assert compare_states(meddled.state, uninterrupted.state) == []


def test_equal_configs_are_equal_whatever_defaults_they_spell_out(config: TrainConfig, tmp_path: Path) -> None:
    from cairn.session import default_run_id
    from cairn.trainers.loading import normalized_config

    body = config.to_json()
    spelled = copy.deepcopy(body)
    spelled["trainer"]["options"].update({"deterministic": True, "scheduler_interval": "step", "split_seed": 0})
    spelled_config = parse_config(spelled)
    assert default_run_id(normalized_config(spelled_config)) == default_run_id(normalized_config(config))
    saved = TrainingSession.fresh("run", tmp_path / "s", config).run(3)
    assert saved is not None
    resumed = TrainingSession.fresh("run2", tmp_path / "s", spelled_config)
    resumed.restore(saved.ref)  # not refused as "another configuration"
    assert resumed.state.step == 3
