"""A checkpoint of another model is refused for being another model, naming the field that
differs, before any bound sized by the run's own model is applied (which would otherwise call
it too large: ``SizeLimitError: total_bytes ... found 5260784`` for a nanoGPT with ``n_embd``
changed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn import errors as E
from cairn.checkpoint import latest_committed
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.training import load_training
from tests.conftest import small_config

pytestmark = pytest.mark.usefixtures("no_signing_key")


@pytest.mark.parametrize("hidden", [64, 4])
def test_a_resume_with_another_model_names_the_field_not_the_size(tmp_path: Path, hidden: int) -> None:
    store = LocalStore(tmp_path / "store")
    base = small_config()
    TrainingSession.fresh("r", store, base).run(5)
    ref = latest_committed(store, "r")
    assert ref is not None
    body = base.model_dump(mode="json")
    assert body["model"]["hidden"] != hidden
    body["model"]["hidden"] = hidden
    other = small_config(model=body["model"])
    with pytest.raises(E.IncompatibleConfigError, match=r"config\.model\.hidden") as info:
        load_training(store, ref, trainer=load_trainer(other))
    assert "SizeLimit" not in str(info.value)
    with pytest.raises(E.IncompatibleConfigError, match=r"config\.model\.hidden"):
        TrainingSession.resume_latest("r", store, other)
