"""The run tools on a user's own trainer (a module of the user's, not shipped with Cairn, named in
the config's ``trainer.factory``): ``cairn train`` checks its store before the first step, commits
once an epoch without ``--checkpoint-every`` and prints a resume command that works; ``ckpt
verify/compare``, ``eval`` and ``report`` trust the trainer the run's config names; the drill's
verdict checks every checkpoint with the run's trainer and says why it refuses one; an
epoch-based run's length is known to the drill."""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.inputs import TrainingRunInput
from cairn.checkpoint import CheckpointRef, read_manifest
from cairn.stores import LocalStore
from tests.conftest import REPO
from tests.unit.workers.cli.conftest import run
from tests.user_trainer import UserModel, installed_user_model, user_config
from workers.drills.observe import WorkerLogs
from workers.drills.runner import DrillResult, run_length
from workers.drills.schedule import DrillSpec
from workers.drills.verdict import judge

MODULE = "user_tools_unit_model"
STEPS_PER_EPOCH = 39
"""The digits train split (70% of 1,797 images) in batches of 32."""


@pytest.fixture
def user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserModel]:
    yield from installed_user_model(tmp_path, monkeypatch, MODULE)


def _train(capsys: pytest.CaptureFixture[str], model: UserModel, store: Path, steps: int, *extra: str) -> str:
    code, out, err = run(capsys, "train", "--config", str(model.config), "--steps", str(steps), "--store", str(store),
                         "--run-id", "mine", *extra)  # fmt: skip
    assert code == 0, err
    return err


def test_default_cadence_commits_once_an_epoch_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_model: UserModel
) -> None:
    store = tmp_path / "s"
    err = _train(capsys, user_model, store, 100)
    steps = sorted(int(m.parent.name) for m in store.rglob("manifest.json"))
    assert steps == [39, 78, 100]  # every epoch, and the end
    assert f"a checkpoint every {STEPS_PER_EPOCH} steps (once an epoch" in err
    assert "cairn: step 39/100 committed" in err and "cairn: step 78/100 committed" in err  # progress, no terminal
    code, out, _ = run(capsys, "train", "--config", str(user_model.config), "--steps", "3", "--store", str(store),
                       "--run-id", "other", "--checkpoint-every", "1", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["checkpoint_every"] == 1


def test_ckpt_verify_compare_and_eval_trust_the_runs_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_model: UserModel
) -> None:
    store = tmp_path / "s"
    _train(capsys, user_model, store, 40)
    ref = f"{store}/mine/training/000000000040"
    config = ["--config", str(user_model.config)]
    code, out, err = run(capsys, "ckpt", "verify", ref, *config)
    assert code == 0 and "model and dataset hash checked" in out, err
    code, out, err = run(capsys, "ckpt", "compare", ref, ref, *config)
    assert code == 0 and out.startswith("identical"), err
    code, out, err = run(capsys, "eval", ref, *config)
    assert code == 0 and out.startswith("val at step 40: loss "), err
    for argv in (("ckpt", "verify", ref), ("ckpt", "compare", ref, ref), ("eval", ref)):
        code, _, err = run(capsys, *argv)  # a bare checkpoint: its trainer is neither shipped nor listed
        assert code == 2 and err.count("\n") == 1, err
        assert f"names trainer '{user_model.factory}', which is not trusted here" in err and "--config FILE" in err


def test_report_from_the_store_trusts_the_runs_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_model: UserModel
) -> None:
    store = tmp_path / "s"
    _train(capsys, user_model, store, 80)
    out = tmp_path / "report"
    code, text, err = run(capsys, "report", str(store), "mine", "--out", str(out), "--config", str(user_model.config),
                          "--json")  # fmt: skip
    assert code == 0, err
    body = json.loads(text)
    assert body["steps"] == 80 and body["evaluations"] == 2 and body["committed_checkpoints"] == 3
    for name in ("loss_lr.png", "timeline.png", "throughput.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
    code, _, err = run(capsys, "report", str(store), "mine", "--out", str(tmp_path / "bare"))
    assert code == 2 and "not trusted here" in err and err.count("\n") == 1


def test_a_run_id_of_another_config_is_refused_before_the_first_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_model: UserModel
) -> None:
    store = tmp_path / "s"
    _train(capsys, user_model, store, 5)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**user_config(user_model.factory), "seed": 4}))
    trained = user_model.marker.read_text()
    code, _, err = run(
        capsys, "train", "--config", str(other), "--steps", "5", "--store", str(store), "--run-id", "mine"
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "run_id: run 'mine'" in err and "already holds checkpoints of another config (latest: step 5; seed" in err
    assert user_model.marker.read_text() == trained  # no step of the other config was trained


def _without_dac_override() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE obeys a directory's mode bits."""
    if ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")


def _cairn(*args: str) -> subprocess.Popen[str]:
    """``cairn ARGS`` in a fresh process, its output piped, that cannot write where mode bits say
    it may not (a root user, as in containers, otherwise writes anywhere)."""
    preexec = _without_dac_override if os.geteuid() == 0 else None
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=preexec,
    )


def test_a_read_only_store_is_refused_before_the_first_step(tmp_path: Path, user_model: UserModel) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        with _cairn("train", "--config", str(user_model.config), "--steps", "100", "--store", str(read_only)) as proc:
            out, err = proc.communicate(timeout=180)
    finally:
        read_only.chmod(0o755)
    assert proc.returncode == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("cairn: error: StoreNotFoundError: store: "), err
    assert "checked before training" in err and "Permission denied" in err
    assert not user_model.marker.exists()  # the trainer was never asked for a step
    assert list(read_only.iterdir()) == []


def test_the_printed_resume_command_resumes_a_user_trainer(tmp_path: Path, user_model: UserModel) -> None:
    """Ctrl-C after the first commit: the command it prints names the config, so the resumed run
    trusts the trainer as its own, and continues."""
    store = tmp_path / "s"
    with _cairn("train", "--config", str(user_model.config), "--steps", "100000000", "--store", str(store),
                "--run-id", "long") as proc:  # fmt: skip
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                if "committed" in line:  # the first epoch is in: interrupt mid-way through the next
                    proc.send_signal(signal.SIGINT)
                    break
            _, rest = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, rest
    resume = rest.split("resume with: ", 1)[1].strip()
    words = shlex.split(resume)
    assert words[:3] == ["cairn", "train", "--resume"] and ["--config", str(user_model.config)] == words[-2:], resume
    words[words.index("--steps") + 1] = "5"
    resumed = subprocess.run([sys.executable, "-m", "workers.cli", *words[1:], "--json"], cwd=REPO, text=True,
                             capture_output=True, timeout=180, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["step"] == CheckpointRef.parse(words[3]).step + 5


def _drill_result(store: Path, config: dict[str, object], final: str) -> DrillResult:
    return DrillResult(
        spec=DrillSpec(),
        schedule=[],
        run_id="mine",
        workflow_id="mine",
        store=str(store),
        total_steps=40,
        checkpoint_every=STEPS_PER_EPOCH,
        t0=0.0,
        finished_at=1.0,
        status="COMPLETED",
        summary={"steps": 40, "checkpoint": final},
        faults=[],
        samples=[],
        logs=WorkerLogs(),
        restarts=[],
        worker_starts=[],
        web_ui=None,
        extra={"config": config, "effects": False},
    )


def test_the_verdict_checks_checkpoints_with_the_runs_trainer_and_says_why_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_model: UserModel
) -> None:
    store = tmp_path / "s"
    _train(capsys, user_model, store, 40)
    config = json.loads(user_model.config.read_text())
    final = f"{store}/mine/training/000000000040"
    checks = {c.name: c for c in judge(_drill_result(store, config, final))}
    assert checks["checkpoints"].passed, checks["checkpoints"].detail
    assert checks["state"].passed and "BIT-IDENTICAL" in checks["state"].detail, checks["state"].detail
    # A flipped byte in step 39's shard: refused, and the verdict says by which rule.
    first = CheckpointRef.parse(f"{store}/mine/training/000000000039")
    manifest = read_manifest(LocalStore(store), first, expect_kind=None)
    shard = store / "mine" / "training" / "000000000039" / manifest.tensors[0].shard
    data = bytearray(shard.read_bytes())
    data[manifest.tensors[0].offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    refused = {c.name: c for c in judge(_drill_result(store, config, final))}["checkpoints"]
    assert not refused.passed
    assert refused.detail.startswith("1 of 2 committed checkpoints refused: step 39: IntegrityError: "), refused.detail
    assert "checksum" in refused.detail


def test_the_drill_knows_an_epoch_based_runs_length(user_model: UserModel) -> None:
    inp = TrainingRunInput.model_validate(
        {"run_id": "e", "config": user_config(user_model.factory), "total_epochs": 2, "store": "/tmp/unused"}
    )
    assert run_length(inp) == (2 * STEPS_PER_EPOCH, f"{2 * STEPS_PER_EPOCH} steps (2 epochs of {STEPS_PER_EPOCH})")
    by_steps = inp.model_copy(update={"total_steps": 50, "total_epochs": None})
    assert run_length(by_steps) == (50, "50 steps")
