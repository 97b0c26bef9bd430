"""Hostile checkpoints: a trainer named only by a checkpoint is never imported on any path; RNG
states are validated by form before use; shapes are bounded by their element count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointRef, read_manifest, write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.reader import read_tensors
from cairn.config import load_config
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from tests.conftest import REPO, rewrite_manifest, write_broken
from workers.cli.main import main as cli

PAYLOAD = """
import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"], "imported").touch()
from cairn.trainers.mlp.trainer import MLPTrainer

class Trainer(MLPTrainer):
    def __init__(self, *args, **kwargs):
        pathlib.Path(os.environ["EVIL_MARKER"], "constructed").touch()
        super().__init__(*args, **kwargs)
"""


@pytest.fixture
def forged(tmp_path: Path) -> tuple[CheckpointRef, dict[str, str]]:
    """A real distributed-config checkpoint whose config was edited to name a payload module that
    is on the Python path (checksums and fingerprint recomputed: validation itself must refuse)."""
    (tmp_path / "payload" / "evilpkg").mkdir(parents=True)
    (tmp_path / "payload" / "evilpkg" / "__init__.py").write_text(PAYLOAD)
    (tmp_path / "marker").mkdir()
    session = TrainingSession.fresh("victim", tmp_path / "store", load_config(str(REPO / "examples/distributed.json")))
    result = session.run(2)
    assert result is not None

    def name_payload(body: dict[str, object]) -> None:
        config: dict[str, object] = body["config"]  # type: ignore[assignment]
        config["trainer"] = {"factory": "evilpkg:Trainer", "options": {}}
        for section in ("model", "data", "optimizer"):  # a trainer of its own takes no built-in sections
            config.pop(section, None)

    rewrite_manifest(session.store, result.ref, name_payload)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "payload"), str(REPO)]),
        "EVIL_MARKER": str(tmp_path / "marker"),
    }
    env.pop("CAIRN_TRAINERS", None)
    return result.ref, env


def _cairn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=180
    )


@pytest.mark.parametrize(
    "path",
    [
        ("ckpt", "verify", "{ref}"),
        ("ckpt", "compare", "{ref}", "{ref}"),
        ("eval", "{ref}"),
        ("train", "--resume", "{ref}", "--steps", "1", "--store", "{store}"),
        ("train", "--resume", "{ref}", "--steps", "1", "--store", "{store}", "--world-size", "2"),
    ],
    ids=["verify", "compare", "eval", "resume", "gang-resume"],
)
def test_a_payload_trainer_named_by_a_checkpoint_is_never_imported(
    forged: tuple[CheckpointRef, dict[str, str]], path: tuple[str, ...]
) -> None:
    ref, env = forged
    args = [a.format(ref=ref, store=ref.store_url) for a in path]
    out = _cairn(env, *args)
    marker = Path(env["EVIL_MARKER"])
    assert sorted(p.name for p in marker.iterdir()) == [], out.stderr
    assert out.returncode == 2, out.stderr
    assert "names trainer 'evilpkg:Trainer'" in out.stderr and "CAIRN_TRAINERS" in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_the_payload_test_can_fail_a_trusted_payload_is_imported(forged: tuple[CheckpointRef, dict[str, str]]) -> None:
    """The marker test detects an import: trusting the payload explicitly makes it run."""
    ref, env = forged
    _cairn({**env, "CAIRN_TRAINERS": "evilpkg:Trainer"}, "ckpt", "verify", str(ref))
    assert (Path(env["EVIL_MARKER"]) / "imported").exists()


def test_the_library_refuses_the_payload_before_import(forged: tuple[CheckpointRef, dict[str, str]]) -> None:
    ref, env = forged
    with pytest.raises(E.ConfigError, match="CAIRN_TRAINERS"):
        TrainingSession.from_checkpoint(ref)
    assert "evilpkg" not in sys.modules


# -- RNG states ----------------------------------------------------------------------------------
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


# -- shapes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [CheckpointKind.JOURNAL, CheckpointKind.RECEIPT])
def test_a_shape_whose_element_count_overflows_is_refused_before_any_array(
    tmp_path: Path, kind: CheckpointKind
) -> None:
    store = LocalStore(tmp_path / "s")
    content = CheckpointContent(kind=kind, run_id="r", step=1)
    result = write_checkpoint(store, content, {"empty": np.zeros((4, 0))})

    def overflow(body: dict[str, object]) -> None:
        body["tensors"][0]["shape"] = [2**40, 2**40, 0]  # type: ignore[index]

    rewrite_manifest(store, result.ref, overflow)
    with pytest.raises(E.TensorSpecError, match="product of the non-zero dimensions"):
        read_tensors(store, result.ref, read_manifest(store, result.ref, expect_kind=kind))
    assert cli(["ckpt", "verify", str(result.ref)]) == 1


def test_numeric_checks_raise_the_typed_error_alone_without_warnings() -> None:
    """A signalling NaN (or a sum that overflows) must not print numpy's RuntimeWarning before the
    one-line error: the suite turns warnings into errors, so a warning fails this test."""
    from cairn.trainers.base import check_finite

    values = np.array([1.0, 2.0], dtype="<f8")
    values.view(np.uint64)[0] = 0x7FF0000000000001  # a signalling NaN
    with pytest.raises(E.NonFiniteError, match=r"tensors\[x\]"):
        check_finite("x", values)
    check_finite("big", np.full(4, 1e308))  # the sum overflows; every value is finite
