"""``cairn train``: a bad config is one line and exit 2; divergence stops before committing; Ctrl-C
and SIGTERM commit a checkpoint and print the resume command; gang input is refused naming the
flag; ``--trainer``; and the seed scenario across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, small_config
from tests.unit.workers.cli.conftest import CONFIG, run
from workers.cli.main import main as cli


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "not valid JSON"),
        ('{"batch_size": 0}', "batch_size"),
        ('{"batch_sise": 2}', "batch_sise"),
        ('{"model": {"hidden": "wide"}}', "model.hidden"),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str) -> None:
    cfg = tmp_path / "bad.json"
    cfg.write_text(content)
    code, out, err = run(capsys, "train", "--config", str(cfg), "--steps", "1", "--store", str(tmp_path / "s"))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cairn: error: ConfigError") and needle in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").rglob("manifest.json"))


def test_diverging_training_stops_before_committing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lr x weight_decay > 2 makes each update multiply the weights by about -(lr x wd): they
    overflow. The run stops with a clear error at the first non-finite value; nothing non-finite
    is committed and --json stays valid JSON."""
    body = json.loads(Path(CONFIG).read_text())
    body["optimizer"].update(lr=5.0, warmup_steps=0, decay="constant", weight_decay=5.0)
    cfg = tmp_path / "hot.json"
    cfg.write_text(json.dumps(body))
    store = tmp_path / "s"
    code, out, err = run(
        capsys,
        "train",
        "--config",
        str(cfg),
        "--steps",
        "1000",
        "--store",
        str(store),
        "--checkpoint-every",
        "50",
        "--json",
    )
    assert code == 1 and "TrainingDivergedError" in err and len(err.strip().splitlines()) == 1
    assert json.loads(out)["error"]["type"] == "TrainingDivergedError"
    committed = [str(m.parent) for m in store.rglob("manifest.json")]
    assert committed  # the early, finite checkpoints
    for ref in committed:
        assert run(capsys, "ckpt", "verify", ref)[0] == 0  # whatever was committed is finite and valid


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_commits_a_checkpoint_and_prints_the_resume_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sig: str
) -> None:
    """Ctrl-C, and SIGTERM (a service manager's stop, a preemption notice), commit a checkpoint
    at the step in progress and print the resume command; exit 128 + the signal's number; the
    handlers that were there before are put back."""
    import os
    import signal
    import threading
    import time

    store = str(tmp_path / "s")
    signum = getattr(signal, sig)
    seen: list[int] = []

    def sentinel(number: int, _frame: object) -> None:  # the signal arrived outside cairn's handler
        seen.append(number)

    before = {s: signal.signal(s, sentinel) for s in (signal.SIGINT, signal.SIGTERM)}

    def send_once_train_listens() -> None:
        deadline = time.monotonic() + 60
        while signal.getsignal(signum) is sentinel and time.monotonic() < deadline:
            time.sleep(0.01)  # cairn train installs its handler once its session is ready
        time.sleep(0.2)  # a few steps in
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=send_once_train_listens, daemon=True)
    sender.start()
    try:
        code, out, err = run(
            capsys, "train", "--config", CONFIG, "--steps", "100000000", "--store", store, "--run-id", "long", "--json"
        )
        sender.join(5)
        restored = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert seen == [] and code == 128 + signum, (seen, code, err)
    assert restored == {signal.SIGINT: sentinel, signal.SIGTERM: sentinel}  # cairn's handlers are gone
    result = json.loads(out)
    assert result["interrupted"] is True and 0 < result["step"] < 100000000
    assert "resume with: cairn train --resume" in err and result["checkpoint"] in err
    assert run(capsys, "ckpt", "verify", result["checkpoint"])[0] == 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--config", "distributed.json", "--world-size", "3"], "--world-size: expected a divisor of "),
        (["--config", "distributed.json", "--world-size", "0"], "one of [1, 2, 4, 8], found 0"),
        (["--config", "config.json", "--world-size", "2"], "--world-size: expected a config with a 'distributed'"),
        (
            ["--resume", "/elsewhere/dp/training/000000000040", "--world-size", "2"],
            "--resume: expected a checkpoint in",
        ),
    ],
)
def test_gang_training_refuses_bad_input_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    argv = [str(REPO / "examples" / a) if a.endswith(".json") else a for a in argv]
    code, _, err = run(capsys, "train", *argv, "--steps", "1", "--store", str(tmp_path / "s"))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").rglob("manifest.json"))


def test_seed_scenario_across_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Export at 17, restore in a fresh Python process, 23 more: identical to 40 uninterrupted."""
    store = tmp_path / "store"
    cfg = REPO / "examples" / "config.json"

    def cairn(*args: str) -> dict[str, object]:  # in this process
        code, out, err = run(capsys, *args, "--json")
        assert code == 0, err
        return json.loads(out)

    def cairn_in_a_fresh_process(*args: str) -> dict[str, object]:
        # The restore is what is under test: nothing of the process that exported may carry over.
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", *args, "--json"],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        return json.loads(out.stdout)

    part = cairn("train", "--config", str(cfg), "--steps", "17", "--store", str(store), "--run-id", "seed")
    assert part["step"] == 17 and part["cursor"] == 34
    resumed = cairn_in_a_fresh_process(
        "train", "--resume", str(part["checkpoint"]), "--steps", "23", "--store", str(store)
    )
    whole = cairn("train", "--config", str(cfg), "--steps", "40", "--store", str(store), "--run-id", "whole")
    assert resumed["step"] == whole["step"] == 40
    assert resumed["cursor"] == whole["cursor"] == 80
    assert resumed["fingerprint"] == whole["fingerprint"]
    code, out, err = run(capsys, "ckpt", "compare", str(resumed["checkpoint"]), str(whole["checkpoint"]))
    assert code == 0, out + err


def test_cli_names_the_trainer_and_run_start_checks_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(small_config().to_json()))
    store = str(tmp_path / "store")
    assert (
        cli(
            [
                "train",
                "--config",
                str(config),
                "--steps",
                "3",
                "--store",
                store,
                "--json",
                "--trainer",
                "cairn.trainers.mlp:MLPTrainer",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["step"] == 3
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"seed": 1, "batch_size": 4}))
    assert cli(["train", "--config", str(bare), "--steps", "3", "--store", store, "--trainer", "nowhere.pkg:Net"]) == 2
    assert "module 'nowhere' is not installed" in capsys.readouterr().err
    # The built-in MLP's sections do not silently ride along with another trainer.
    assert (
        cli(["train", "--config", str(config), "--steps", "3", "--store", store, "--trainer", "nowhere.pkg:Net"]) == 2
    )
    assert "'model' configures the built-in MLP" in capsys.readouterr().err
    run = json.loads((REPO / "examples" / "run.json").read_text())
    run["config"]["trainer"] = {"factory": "cairn.trainers.mlp:MLPTrainer", "options": {"depth": 3}}
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(run))
    assert cli(["run", "start", str(run_file), "--address", "127.0.0.1:1"]) == 2  # before connecting
    assert "config.trainer.options: depth: Extra inputs are not permitted" in capsys.readouterr().err


def test_into_a_pipe_train_and_export_draw_no_bar(tmp_path: Path) -> None:
    """``cairn train ... 2>&1 | tee log`` and an export: their progress bars are off where stderr
    is no terminal (no ``\\r`` frame in the log), and what they print is still there."""
    store = tmp_path / "store"

    def cairn(*args: str) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", *args],
            capture_output=True,  # stdout and stderr are pipes; bytes: text mode would turn \r into \n
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done

    cfg = REPO / "examples" / "config.json"
    trained = cairn("train", "--config", str(cfg), "--steps", "300", "--store", str(store), "--run-id", "piped")
    ref = trained.stdout.decode().strip().splitlines()[-1]
    assert ref == str(store / "piped" / "training" / "000000000300"), trained.stdout
    exported = cairn("ckpt", "export", ref, str(tmp_path / "out"), "--format", "safetensors")
    for done in (trained, exported):
        assert b"\r" not in done.stderr + done.stdout, done.stderr
    assert b"run piped: steps 0..300" in trained.stderr, trained.stderr
