"""``cairn ckpt show`` names the tokenizer of a run that has one: the config's
``tokenizer_version``, or the one a Hugging Face run trains on its own data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.conftest import CONFIG, run

pytest.importorskip("transformers")


def tiny_hf_config(folder: Path) -> Path:
    """``examples/hf-gpt2.json``, smaller: a 300-token tokenizer on 20 kB of text, a 32-wide model."""
    body = json.loads((REPO / "examples" / "hf-gpt2.json").read_text())
    options = body["trainer"]["options"]
    options["model"].update(n_embd=32, n_head=2)
    options.update(vocab_size=300, corpus_bytes=20_000, context=32)
    path = folder / "tiny-hf.json"
    path.write_text(json.dumps(body))
    return path


def test_show_names_the_tokenizer_a_hugging_face_run_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_hf_config(tmp_path)
    store = str(tmp_path / "s")
    code, out, err = run(capsys, "train", "--config", str(config), "--steps", "1", "--store", store, "--run-id", "hf")
    assert code == 0, err
    ref = out.strip()
    code, out, err = run(capsys, "ckpt", "show", ref)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("model "))
    tokenizer = line.split("tokenizer ", 1)[1]
    assert tokenizer.startswith("trained on the run's data: 300 tokens (text-bpe300, sha256:"), line
    code, out, err = run(capsys, "ckpt", "show", ref, "--json")
    assert code == 0 and json.loads(out)["tokenizer"] == tokenizer, out


def test_show_names_the_configs_tokenizer_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = json.loads(Path(CONFIG).read_text())
    body["tokenizer_version"] = "bpe-2026-01"
    config = tmp_path / "c.json"
    config.write_text(json.dumps(body))
    code, out, err = run(capsys, "train", "--config", str(config), "--steps", "1", "--store", str(tmp_path / "s"))
    assert code == 0, err
    code, shown, err = run(capsys, "ckpt", "show", out.strip())
    assert code == 0 and "tokenizer bpe-2026-01" in shown, shown
    code, shown, err = run(capsys, "ckpt", "show", out.strip(), "--json")
    assert json.loads(shown)["tokenizer"] == "bpe-2026-01"
    code, out, err = run(capsys, "train", "--config", CONFIG, "--steps", "1", "--store", str(tmp_path / "t"))
    code, shown, err = run(capsys, "ckpt", "show", out.strip(), "--json")  # none declared, none trained
    assert json.loads(shown)["tokenizer"] == "none"


def test_show_says_how_many_bytes_a_compressed_checkpoint_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sizes stay logical (the state's bytes); a compressed checkpoint adds what it stores."""
    import numpy as np

    from cairn.checkpoint import CheckpointKind, CheckpointOptions
    from cairn.checkpoint.commit import write_checkpoint
    from cairn.checkpoint.content import CheckpointContent
    from cairn.stores import LocalStore

    weights = {"w": (np.random.default_rng(0).standard_normal(1 << 18) * 0.02).astype(np.float32)}
    store = LocalStore(tmp_path / "s")
    content = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="packed", step=1)
    ref = str(write_checkpoint(store, content, weights, options=CheckpointOptions(compression="zstd")).ref)
    code, out, err = run(capsys, "ckpt", "show", ref)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("stored "))
    assert "x smaller): 1 of 1 entries compressed (blosc2-zstd)" in line, line
    code, out, err = run(capsys, "ckpt", "show", ref, "--json")
    body = json.loads(out)
    assert body["total_bytes"] == 1 << 20 and 0 < body["stored_bytes"] < 0.95 * (1 << 20), body
