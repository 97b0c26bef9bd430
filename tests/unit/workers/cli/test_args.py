"""The arguments the commands share (``workers.cli.args``): stores, run ids and counts are checked
before anything is written; usage errors are JSON with --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.workers.cli.conftest import CONFIG, run


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


def test_did_you_mean_reads_both_forms_of_argparses_choice_list() -> None:
    from workers.cli.args import did_you_mean

    quoted = "argument command: invalid choice: 'trian' (choose from 'train', 'eval', 'ckpt')"  # 3.11
    bare = "argument command: invalid choice: 'trian' (choose from train, eval, ckpt)"  # later releases
    assert did_you_mean(quoted) == did_you_mean(bare) == "; did you mean 'train'?"
    assert did_you_mean("argument --steps: expected one argument") == ""
