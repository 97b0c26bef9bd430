"""``cairn ckpt``: show, verify, list, compare, gc, pin and unpin, in text and --json; a missing or
corrupt checkpoint and a bad reference are one line and a non-zero exit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.conftest import CONFIG, run


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


def test_missing_files_and_refs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "train", "--config", str(tmp_path / "nope.json"), "--steps", "1", "--store", str(tmp_path)
    )
    assert code == 2 and "config file not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "ckpt", "verify", str(tmp_path / "run" / "training" / "000000000001"))
    assert code == 1 and "CheckpointNotFoundError" in err
    code, _, err = run(capsys, "ckpt", "show", "not-a-reference")
    assert code == 2 and "ReferenceSyntaxError" in err and "STORE/RUN_ID/KIND/STEP" in err


def test_corrupt_checkpoint_verify_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    code, out, _ = run(capsys, "train", "--config", CONFIG, "--steps", "2", "--store", str(store), "--json")
    ref = json.loads(out)["checkpoint"]
    shard = next(p for p in store.rglob("*.bin"))
    shard.write_bytes(b"\0" * shard.stat().st_size)
    code, _, err = run(capsys, "ckpt", "verify", ref)
    assert code == 1 and "IntegrityError" in err and "checksum" in err


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


# -- --config: the given config decides -----------------------------------------------------------

DIFFERING = [
    ({"seed": 8}, "config.seed"),
    ({"model": {"hidden": 12}}, "config.model.hidden"),
    ({"data": {"n_examples": 200}}, "config.data.n_examples"),
]


def _config_file(tmp_path: Path, change: dict[str, object]) -> str:
    """The example config with ``change`` merged into it (a section's fields, or a top-level value)."""
    body = json.loads(Path(CONFIG).read_text())
    for key, value in change.items():
        body[key] = {**body[key], **value} if isinstance(value, dict) else value
    path = tmp_path / "given.json"
    path.write_text(json.dumps(body))
    return str(path)


def _trained(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    code, out, _ = run(capsys, "train", "--config", CONFIG, "--steps", "2", "--store", str(tmp_path / "s"), "--json")
    assert code == 0
    return str(json.loads(out)["checkpoint"])


def _command(name: str, ref: str, out: Path) -> tuple[str, ...]:
    return {
        "verify": ("ckpt", "verify", ref),
        "export": ("ckpt", "export", ref, str(out), "--format", "safetensors"),
        "eval": ("eval", ref),
        "compare": ("ckpt", "compare", ref, ref),
    }[name]


@pytest.mark.parametrize(("change", "field"), DIFFERING, ids=["seed", "hidden", "dataset-size"])
@pytest.mark.parametrize("name", ["verify", "export", "eval", "compare"])
def test_a_checkpoint_that_differs_from_the_given_config_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, change: dict[str, object], field: str
) -> None:
    """``--config`` means the given config decides: the trainer is built from it, and a checkpoint
    of another seed, model or dataset is refused in one line, expected (the config) vs found."""
    ref = _trained(capsys, tmp_path)
    code, out, err = run(capsys, *_command(name, ref, tmp_path / "out"), "--config", _config_file(tmp_path, change))
    assert code == 1 and out == "", err
    assert err.count("\n") == 1 and "IncompatibleConfigError" in err and f"{field}:" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["verify", "export", "compare"])
def test_the_runs_own_config_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """A config that differs only where a checkpoint may (the optimizer: not an identity field) is the run's."""
    ref = _trained(capsys, tmp_path)
    given = _config_file(tmp_path, {"optimizer": {"lr": 0.5}})
    code, _, err = run(capsys, *_command(name, ref, tmp_path / "out"), "--config", given)
    assert code == 0, err


# -- --format dcp: a PyTorch Distributed Checkpoint ----------------------------------------------------

DCP_TRAIN = "cairn train --config examples/digits.json --steps 20 --store runs --run-id digits"
DCP_EXPORT = "cairn ckpt export runs/digits/training/000000000020 digits-dcp --format dcp"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_export_format_dcp_in_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A torch run's export holds its model and optimizer (``kind: dcp``); ``--weights-only`` and a
    trainer without a torch optimizer (the built-in MLP) the model alone; the text names what it is."""
    pytest.importorskip("torch")
    from tests.conftest import digits_config

    config = tmp_path / "digits.json"
    config.write_text(digits_config().model_dump_json())
    code, out, err = run(capsys, "train", "--config", str(config), "--steps", "3", "--store", str(tmp_path / "s"))
    assert code == 0, err
    ref = out.strip()
    code, out, err = run(capsys, "ckpt", "export", ref, str(tmp_path / "full"), "--format", "dcp", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["kind"] == "dcp" and body["files"] == [".metadata", "__0_0.distcp"] and body["checkpoint"] == ref
    assert body["bytes"] == sum((tmp_path / "full" / name).stat().st_size for name in body["files"])
    assert body["tensors"] == 13 + 10 * 3  # 10 parameters, 3 BatchNorm buffers; each parameter's 3 AdamW tensors
    code, out, err = run(capsys, "ckpt", "export", ref, str(tmp_path / "weights"), "--format", "dcp", "--weights-only")
    assert code == 0 and "PyTorch Distributed Checkpoint of the model's state dict: WEIGHTS ONLY" in out, err
    mlp = _trained(capsys, tmp_path / "mlp")
    code, out, err = run(capsys, "ckpt", "export", mlp, str(tmp_path / "mlp-dcp"), "--format", "dcp", "--json")
    assert code == 0 and json.loads(out)["kind"] == "dcp-weights-only", err


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_the_dcp_export_loads_in_plain_pytorch_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "PyTorch Distributed Checkpoint (DCP) in and out" (docs/how-to/your-model.md): its two
    commands, then its Python example (its assert: the model holds the checkpoint's weights), and
    the optimizer it loaded holds the checkpoint's moments bit for bit."""
    pytest.importorskip("torch")
    import cairn
    from cairn.trainers.pytorch.state_io import to_numpy
    from tests.unit.workers.cli.test_readme_commands import docs_text, readme_words

    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    for command in (DCP_TRAIN, DCP_EXPORT):
        code, _, err = run(capsys, *readme_words(command))
        assert code == 0, (command, err)
    text = docs_text()
    section = text[text.index("## PyTorch Distributed Checkpoint (DCP) in and out") :]
    example = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert example is not None and "dcp.load(" in example.group(1)
    namespace: dict[str, object] = {}
    exec(compile(example.group(1), "docs/how-to/your-model.md", "exec"), namespace)
    state = cairn.load_checkpoint("runs/digits/training/000000000020", config="examples/digits.json").state
    model, optimizer = namespace["model"], namespace["optimizer"]
    for name, param in model.named_parameters():  # type: ignore[attr-defined]
        for key, value in optimizer.state[param].items():  # type: ignore[attr-defined]
            assert to_numpy(value).tobytes() == state.tensors[f"optim/{name}/{key}"].tobytes(), (name, key)
