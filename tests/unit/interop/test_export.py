"""``ckpt export --format safetensors``: a Hugging Face directory that ``from_pretrained`` loads
with the checkpoint model's logits (fp32 and bf16, one file or sharded with an index), a
weights-only file for any trainer, streamed with every checksum verified: a corrupt block
stops the export and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cairn import errors as E
from cairn.checkpoint import CheckpointRef, read_manifest
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.validate import manifest_config
from cairn.config import TrainConfig
from cairn.interop.export import export_checkpoint
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.training import load_training
from tests.conftest import HF_MODELS, REPO, digits_dp_config, hf_config, small_config
from workers.cli.main import main

transformers = pytest.importorskip("transformers")


def trained(config: TrainConfig, tmp_path: Path, steps: int = 12) -> tuple[LocalStore, CheckpointRef]:
    session = TrainingSession.fresh("run", tmp_path / "store", config)
    result = session.run(steps)
    assert result is not None
    return LocalStore(tmp_path / "store"), result.ref


def export(store: LocalStore, ref: CheckpointRef, out: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    """What ``cairn ckpt export`` does: the manifest and the trainer it names; no state is loaded."""
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    return export_checkpoint(store, ref, manifest, load_trainer(manifest_config(manifest)), out, **kwargs)  # type: ignore[arg-type]


def checkpoint_logits(store: LocalStore, ref: CheckpointRef, batch: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    state, _ = load_training(store, ref, run_config=config)
    trainer = load_trainer(state.config)
    trainer.load_state(state)  # type: ignore[attr-defined]
    trainer.model.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        return trainer.forward(batch)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(
    ("model", "options", "max_file_bytes"),
    [("gpt2", {}, 5_000_000_000), ("llama", {"param_dtype": "bfloat16"}, 20_000)],
)
def test_from_pretrained_gives_the_checkpoints_logits(
    tmp_path: Path, model: str, options: dict[str, object], max_file_bytes: int
) -> None:
    config = hf_config(model, **options)
    store, ref = trained(config, tmp_path)
    result = export(store, ref, tmp_path / "out", max_file_bytes=max_file_bytes)
    assert result.kind == "huggingface"
    files = set(result.files)
    assert {"config.json", "tokenizer.json"} <= files
    if max_file_bytes < 1 << 20:
        assert "model.safetensors.index.json" in files and sum(".safetensors" in f for f in files) > 2
    else:
        assert "model.safetensors" in files
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    loaded.eval()
    batch = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = loaded(batch).logits
    want = checkpoint_logits(store, ref, batch, config)
    assert got.dtype == want.dtype == (torch.bfloat16 if options else torch.float32)
    assert torch.equal(got, want)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.decode(tokenizer("def f(x):\n    return x").input_ids) == "def f(x):\n    return x"


def test_a_corrupt_block_stops_the_export_and_leaves_nothing(tmp_path: Path) -> None:
    store, ref = trained(hf_config("gpt2"), tmp_path, steps=3)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    entry = next(t for t in manifest.tensors if t.name.startswith("param/transformer.h.0.mlp"))
    shard = tmp_path / "store" / ref.prefix / entry.shard
    raw = bytearray(shard.read_bytes())
    raw[entry.offset + entry.length // 2] ^= 0x10
    shard.write_bytes(bytes(raw))
    with pytest.raises(E.IntegrityError) as info:  # 64-byte chunks: bytes are written before the check fails
        export(store, ref, tmp_path / "out", chunk_bytes=64)
    assert entry.name in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no partial directory either


def test_a_non_empty_destination_is_refused(tmp_path: Path) -> None:
    store, ref = trained(small_config(), tmp_path, steps=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(E.ConfigError, match="not empty"):
        export(store, ref, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_any_trainer_exports_its_weights_only_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.numpy import load_file

    store, ref = trained(small_config(), tmp_path, steps=4)
    ckpt = str(ref)
    assert main(["ckpt", "export", ckpt, str(tmp_path / "out"), "--format", "safetensors", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["kind"] == "weights-only" and payload["files"] == ["weights-only.safetensors"]
    loaded = load_file(str(tmp_path / "out" / "weights-only.safetensors"))
    state, _ = load_training(store, ref)
    assert set(loaded) == {n for n in state.tensors if n.startswith("theta/")}
    for name, arr in loaded.items():
        assert np.array_equal(arr, state.tensors[name])
    assert main(["ckpt", "export", ckpt, str(tmp_path / "out2"), "--format", "onnx"]) == 2


def test_a_blocked_checkpoint_of_a_distributed_run_exports_whole_tensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    config = digits_dp_config()
    store, ref = trained(config, tmp_path, steps=2)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    assert manifest.parts is not None and any("#00001" in t.name for t in manifest.tensors)  # blocked, several blocks
    result = export(store, ref, tmp_path / "out")
    assert result.kind == "weights-only"
    loaded = load_file(str(tmp_path / "out" / "weights-only.safetensors"))
    state, _ = load_training(store, ref, run_config=config)
    names, _ = load_trainer(config).exchange_names()
    assert set(loaded) == set(names)
    for key, name in names.items():
        assert loaded[key].numpy().tobytes() == state.tensors[name].tobytes(), key


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"model": {**HF_MODELS["gpt2"], "n_embd": 64}}, "config.trainer.options.model.n_embd"),
        ({"corpus": [str(REPO / "README.md")]}, "config.trainer.options.corpus"),
        ({"corpus_bytes": 5000}, "config.trainer.options.corpus_bytes"),
    ],
    ids=["model-size", "corpus", "corpus-size"],
)
def test_a_hugging_face_checkpoint_is_checked_against_the_given_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any], field: str
) -> None:
    """``--config`` decides the model size and the corpus: a checkpoint of another is refused by
    verify and export in one line naming the option, and nothing is written."""
    _, ref = trained(hf_config("gpt2"), tmp_path, steps=2)
    given = tmp_path / "given.json"
    given.write_text(json.dumps(hf_config("gpt2", **options).model_dump(mode="json")))
    out = tmp_path / "out"
    for args in (["ckpt", "verify", str(ref)], ["ckpt", "export", str(ref), str(out), "--format", "safetensors"]):
        assert main([*args, "--config", str(given)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "IncompatibleConfigError" in err and f"{field}:" in err, err
    assert not out.exists()
