"""``cairn.load_model`` / ``cairn.load_checkpoint``: from a checkpoint reference to the trainer's
model (or the whole state), under the trust rule and with every check of a validated import; and
the names ``cairn`` exports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import errors as E
from cairn.checkpoint import read_manifest
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import digits_config, hf_config, small_config
from tests.user_trainer import UserModel, installed_user_model


def test_the_builtin_mlp_gives_its_weights(tmp_path: Path) -> None:
    """A trainer without a model object gives its weights, under the names an export writes."""
    config = small_config()
    result = TrainingSession.fresh("mlp", tmp_path, config).run(5)
    assert result is not None
    weights = cairn.load_model(str(result.ref))
    state, _ = load_training(LocalStore(tmp_path), result.ref)
    assert sorted(weights) == sorted(n for n in state.tensors if n.startswith("theta/"))
    for name, values in weights.items():
        assert np.array_equal(values, state.tensors[name]), name
    loaded = cairn.load_checkpoint(str(result.ref), config)  # the full state, the config deciding
    assert loaded.state.step == 5 and loaded.manifest.fingerprint == result.manifest.fingerprint
    assert all(np.array_equal(loaded.state.tensors[n], state.tensors[n]) for n in state.tensors)


def test_a_torch_model_is_the_trainers_module_in_eval_mode(tmp_path: Path) -> None:
    import torch

    config = digits_config()
    session = TrainingSession.fresh("digits", tmp_path, config)
    result = session.run(3)
    assert result is not None
    model = cairn.load_model(str(result.ref), config)
    assert isinstance(model, torch.nn.Module) and not model.training
    live = session.trainer.model.state_dict()
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(live) and all(torch.equal(loaded[n], live[n]) for n in live)
    x = torch.rand(8, 1, 8, 8)
    session.trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), session.trainer.model(x))


@pytest.fixture
def user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserModel]:
    yield from installed_user_model(tmp_path, monkeypatch, "models_api_user_model")


def test_the_trust_rule_and_every_check_apply(tmp_path: Path, user_model: UserModel) -> None:
    config = cairn.load_config(user_model.config)
    store = tmp_path / "s"
    result = TrainingSession.fresh("mine", store, config).run(2)
    assert result is not None
    ref = str(result.ref)
    with pytest.raises(E.ConfigError, match="which is not trusted here"):
        cairn.load_model(ref)  # a bare checkpoint of a trainer neither shipped nor listed
    assert cairn.load_model(ref, str(user_model.config)) is not None  # the run's config: trusted
    other = json.loads(user_model.config.read_text())
    other["seed"] += 1
    changed = tmp_path / "other.json"
    changed.write_text(json.dumps(other))
    with pytest.raises(E.IncompatibleConfigError, match="different run configuration"):
        cairn.load_model(ref, changed)  # the config decides; the checkpoint must match it
    manifest = read_manifest(LocalStore(store), result.ref, expect_kind=None)
    entry = manifest.tensors[0]
    shard = store / result.ref.prefix / entry.shard
    data = bytearray(shard.read_bytes())
    data[entry.offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(E.IntegrityError):
        cairn.load_model(ref, config)
    with pytest.raises(E.ConfigError, match="checkpoint.kind"):
        cairn.load_model(ref.replace("/training/", "/journal/"), config)


def test_a_hugging_face_model_needs_its_config_and_gives_the_trained_logits(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = hf_config()
    session = TrainingSession.fresh("hf", tmp_path, config)
    result = session.run(2)
    assert result is not None
    with pytest.raises(E.ConfigError, match="not trusted here"):
        cairn.load_model(str(result.ref))  # it ships, but its options are not a checkpoint's to choose
    model = cairn.load_model(str(result.ref), config)
    ids = torch.arange(16).reshape(1, 16)
    session.trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, session.trainer.forward(ids))
