"""The cairn CLI: JSON output for scripts, one clear line and a non-zero exit for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from workers.cli.main import main

CONFIG = str(REPO / "examples" / "config.json")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_json_and_ckpt_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    code, out, _ = run(
        capsys,
        "train",
        "--config",
        CONFIG,
        "--steps",
        "6",
        "--store",
        store,
        "--checkpoint-every",
        "3",
        "--run-id",
        "cli",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert {"checkpoint", "step", "cursor", "fingerprint"} <= set(result)
    assert result["step"] == 6 and result["cursor"] == 12
    ref = result["checkpoint"]

    code, out, _ = run(capsys, "ckpt", "show", ref, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["step"] == 6 and shown["cursor"] == 12
    assert shown["fingerprint"] == result["fingerprint"] and shown["checkpoint"] == ref

    code, out, _ = run(capsys, "ckpt", "verify", ref, "--json")
    assert code == 0 and json.loads(out)["ok"] is True

    code, out, _ = run(capsys, "ckpt", "list", store, "--run", "cli", "--json")
    assert [c["step"] for c in json.loads(out)["checkpoints"]] == [3, 6]

    code, out, _ = run(capsys, "ckpt", "compare", ref, ref.replace("000000000006", "000000000003"), "--json")
    verdict = json.loads(out)
    assert code == 1 and verdict["identical"] is False
    assert {"t", "cursor", "rng"} <= {d["field"] for d in verdict["differences"]}


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


def test_missing_files_and_refs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "train", "--config", str(tmp_path / "nope.json"), "--steps", "1", "--store", str(tmp_path)
    )
    assert code == 2 and "config file not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "ckpt", "verify", str(tmp_path / "run" / "training" / "000000000001"))
    assert code == 1 and "CheckpointNotFoundError" in err
    code, _, err = run(capsys, "ckpt", "show", "not-a-reference")
    assert code == 2 and "ReferenceSyntaxError" in err and "STORE/RUN_ID/KIND/STEP" in err


def test_debug_shows_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "ckpt", "verify", str(tmp_path / "r" / "training" / "000000000001"), "--debug")
    assert code == 1 and "Traceback" in err


def test_corrupt_checkpoint_verify_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    code, out, _ = run(capsys, "train", "--config", CONFIG, "--steps", "2", "--store", str(store), "--json")
    ref = json.loads(out)["checkpoint"]
    shard = next(p for p in store.rglob("*.bin"))
    shard.write_bytes(b"\0" * shard.stat().st_size)
    code, _, err = run(capsys, "ckpt", "verify", ref)
    assert code == 1 and "IntegrityError" in err and "checksum" in err


def test_config_error_names_the_field_with_expected_and_found() -> None:
    from cairn.errors import ConfigError

    err = ConfigError("steps", expected=">= 0", found=-3)
    assert str(err) == "steps: expected >= 0, found -3" and err.field == "steps"
    assert ConfigError("x: free text").field is None


def test_error_policy_is_declared_on_the_classes() -> None:
    from cairn import errors as E

    assert E.StorageError.retryable and E.StorageError.exit_code == 3
    assert not E.CheckpointError.retryable and E.IntegrityError.exit_code == 1
    assert E.ConfigError.exit_code == 2 and E.ReferenceSyntaxError.exit_code == 2
    assert E.EffectUnavailableError.retryable and E.EffectUnavailableError.exit_code == 4
    assert not E.InvalidObjectError.retryable and E.TemporalUnavailableError.exit_code == 5


def test_json_errors_are_one_json_object_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "ckpt", "show", "nope", "--json")
    body = json.loads(out)
    assert code == 2 and body["ok"] is False and body["error"]["type"] == "ReferenceSyntaxError"
    assert body["error"]["exit_code"] == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--config", CONFIG, "--steps", "1", "--store", ""], "--store"),
        (["train", "--config", CONFIG, "--steps", "1", "--store", "S", "--run-id", ""], "--run-id"),
        (["train", "--config", CONFIG, "--steps", "1", "--store", "S", "--run-id", "../x"], "--run-id"),
        (["train", "--config", CONFIG, "--steps", "-1", "--store", "S"], "--steps"),
        (["train", "--config", CONFIG, "--steps", "1000000000000", "--store", "S"], "--steps"),
        (
            ["train", "--config", CONFIG, "--steps", "1", "--store", "S", "--checkpoint-every", "0"],
            "--checkpoint-every",
        ),
        (["ckpt", "list", "TYPO"], "store"),
        (["ckpt", "gc", "S", "--run", ".."], "--run"),
        (
            ["ckpt", "show", "S/run/training/\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660\u0661\u0662"],
            "step",
        ),
    ],
    ids=[
        "empty-store",
        "empty-run-id",
        "dotdot-run-id",
        "negative-steps",
        "huge-steps",
        "every-0",
        "list-typo",
        "gc-dotdot",
        "arabic-digits",
    ],
)
def test_bad_paths_and_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "S").mkdir()
    code, out, err = run(capsys, *argv)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["S"] and not any((tmp_path / "S").iterdir())


def test_list_and_gc_of_a_missing_run_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    assert run(capsys, "train", "--config", CONFIG, "--steps", "2", "--store", store, "--run-id", "r")[0] == 0
    code, _, err = run(capsys, "ckpt", "list", store, "--run", "other")
    assert code == 2 and "other" in err
    code, _, err = run(capsys, "ckpt", "gc", store, "--run", "other")
    assert code == 2 and "other" in err
    code, _, err = run(capsys, "ckpt", "gc", str(tmp_path / "typo"), "--run", "r")
    assert code == 2 and "typo" in err


def test_pins_are_listed_and_can_be_removed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    code, out, _ = run(
        capsys,
        "train",
        "--config",
        CONFIG,
        "--steps",
        "4",
        "--store",
        store,
        "--run-id",
        "r",
        "--checkpoint-every",
        "2",
        "--json",
    )
    ref = json.loads(out)["checkpoint"]
    first = ref.replace("000000000004", "000000000002")
    assert run(capsys, "ckpt", "pin", first, "--name", "best")[0] == 0
    code, out, _ = run(capsys, "ckpt", "list", store, "--run", "r", "--json")
    rows = {c["step"]: c["pins"] for c in json.loads(out)["checkpoints"]}
    assert rows == {2: ["best"], 4: []}
    code, out, _ = run(capsys, "ckpt", "list", store, "--run", "r")
    assert "pinned: best" in out
    assert run(capsys, "ckpt", "unpin", store, "--run", "r", "--name", "best")[0] == 0
    code, out, _ = run(capsys, "ckpt", "list", store, "--run", "r", "--json")
    assert all(c["pins"] == [] for c in json.loads(out)["checkpoints"])
    code, _, err = run(capsys, "ckpt", "unpin", store, "--run", "r", "--name", "best")
    assert code == 2 and "best" in err


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


def test_broken_pipe_is_quiet(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = tmp_path / "s"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "train",
            "--config",
            CONFIG,
            "--steps",
            "3",
            "--store",
            str(store),
            "--run-id",
            "r",
            "--checkpoint-every",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "ckpt", "list", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before we write
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_report_from_the_store_writes_pngs_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    code, _, _ = run(capsys, "train", "--config", CONFIG, "--steps", "60", "--store", store, "--run-id", "rep",
                     "--checkpoint-every", "10")  # fmt: skip
    assert code == 0
    out = tmp_path / "report"
    code, text, _ = run(capsys, "report", store, "rep", "--out", str(out), "--json")
    body = json.loads(text)
    assert code == 0 and body["steps"] == 60 and body["committed_checkpoints"] == 6
    assert body["final_loss"] is not None and body["final_loss"] < body["min_loss"] + 1
    for name in ("loss_lr.png", "timeline.png", "throughput.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name
    assert "60 steps" in (out / "summary.txt").read_text()
    code, _, err = run(capsys, "report", store, "nope", "--out", str(out))
    assert code == 2 and "nope" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--config", CONFIG, "--steps", "abc", "--store", "S", "--json"], "--steps"),
        (["train", "--config", CONFIG, "--steps", "\u0663", "--store", "S", "--json"], "ASCII digits"),
        (["ckpt", "list", "--json"], "store"),
        (["nosuchcommand", "--json"], "invalid choice"),
    ],
    ids=["not-a-number", "arabic-digit", "missing-argument", "unknown-command"],
)
def test_usage_errors_are_json_with_json(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    code, out, err = run(capsys, *argv)
    body = json.loads(out)
    assert code == 2 and body["error"]["type"] == "UsageError" and needle in body["error"]["message"]
    assert "Traceback" not in err


def test_bad_inputs_found_in_review(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    assert run(capsys, "train", "--config", CONFIG, "--steps", "3", "--store", store, "--run-id", "r")[0] == 0
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, _, err = run(capsys, "report", store, "r", "--out", str(a_file))
    assert code == 2 and "--out" in err and "Traceback" not in err
    code, _, err = run(capsys, "ckpt", "gc", store, "--run", "r", "--grace-seconds", "-5")
    assert code == 2 and "grace_seconds" in err
    code, _, err = run(capsys, "train", "--config", CONFIG, "--steps", "1", "--store", "http://x/y")
    assert code == 2 and "unsupported scheme" in err and not (tmp_path / "http:").exists()


def test_run_start_checks_the_file_before_connecting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad run file is exit 2 with the field named, even with no Temporal server to talk to."""
    from workers.stack.servers import free_port

    body = json.loads((REPO / "examples" / "run.json").read_text())
    body["checkpoint"] = {"evry": 3}
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(body))
    code, _, err = run(capsys, "run", "start", str(bad), "--address", f"127.0.0.1:{free_port()}")
    assert code == 2 and "checkpoint.evry" in err and "did you mean 'every'" in err, err


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


@pytest.mark.parametrize(("nodes", "refused"), [("a,,b", True), ("a,a", True), ("", False)])
def test_run_start_refuses_empty_or_repeated_nodes_before_connecting(
    capsys: pytest.CaptureFixture[str], nodes: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty name in the list is refused (not silently dropped); ``--nodes ""`` clears the
    file's nodes (one node, any worker) and goes on to connect."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens: a refusal must come first
    run_file = str(REPO / "examples" / "distributed-run.json")
    code, _, err = run(capsys, "run", "start", run_file, "--world-size", "2", "--nodes", nodes)
    if refused:
        assert code == 2 and "ConfigError" in err and "nodes" in err, err
    else:
        assert code == 5 and "TemporalUnavailableError" in err, err  # the input passed its checks
