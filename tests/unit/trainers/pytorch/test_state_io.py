"""RNG states in a checkpoint (``cairn.trainers.pytorch.state_io``) are validated by form before use:
a torch state its generator would not accept (refused by resume and by ``cairn ckpt verify``), an
all-zero Python state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.config import load_config
from cairn.session import TrainingSession
from tests.conftest import REPO, write_broken
from workers.cli.main import main as cli


@pytest.mark.parametrize("how", ["random", "zeros", "ones"])
def test_a_corrupt_torch_rng_state_is_refused_by_verify_and_by_resume(tmp_path: Path, how: str) -> None:
    pytest.importorskip("torch")
    config = load_config(str(REPO / "examples" / "digits.json"))
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    session.run(2)

    def corrupt(arrays: dict[str, np.ndarray]) -> None:
        size = arrays["rng/torch"].size
        fill = {"random": np.random.default_rng(0).integers(0, 256, size), "zeros": np.zeros(size), "ones": None}[how]
        arrays["rng/torch"] = np.full(size, 255, np.uint8) if fill is None else fill.astype(np.uint8)

    ref = write_broken(session.store, "forged", session.state.copy(), tensors=corrupt)
    before = session.state.copy()
    with pytest.raises(E.InvariantError, match=r"tensors\[rng/torch\]: RNG state is not a state its generator"):
        session.restore(ref)
    assert session.state.step == before.step and session.restored_from is None  # untouched
    assert cli(["ckpt", "verify", str(ref)]) == 1
    assert cli(["train", "--resume", str(ref), "--steps", "1", "--store", str(tmp_path / "s")]) == 1


def test_an_all_zero_python_rng_state_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    session = TrainingSession.fresh("run", tmp_path / "s", load_config(str(REPO / "examples" / "digits.json")))
    session.run(1)
    rng = json.loads(json.dumps(session.state.rng_state))
    rng["python"]["state"] = [0] * 624 + [624]
    ref = write_broken(session.store, "forged", session.state.copy(), rng=rng)
    with pytest.raises(E.InvariantError, match=r"rng\.python\.state"):
        session.restore(ref)
