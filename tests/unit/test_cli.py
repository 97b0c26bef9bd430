"""The cairn CLI: JSON output for scripts, one clear line and a non-zero exit for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from workers.cli import main

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
    assert code == 1 and "STORE/RUN_ID/KIND/STEP" in err


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
