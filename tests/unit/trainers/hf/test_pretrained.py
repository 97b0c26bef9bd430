"""A pretrained Hugging Face directory fine-tuned with its own tokenizer: it resumes bit for bit
(17 + 23 == 40; weights alone diverge), starts from the directory's weights, records the
directory's content hash, exports to a directory ``from_pretrained`` loads with the fine-tuned
logits; a directory whose config, tokenizer and weights disagree is one typed line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from cairn import errors as E
from cairn.checkpoint.compare import compare_states
from cairn.interop.weights import content_hash
from cairn.session import TrainingSession
from cairn.trainers.hf.pretrained import TOKENIZER_FILES
from cairn.trainers.loading import load_trainer
from tests.conftest import seed_fixture
from tests.unit.trainers.hf.conftest import pretrained_config, save_pretrained_dir
from workers.cli.main import main


def test_a_pretrained_directory_fine_tunes_with_its_own_tokenizer_and_resumes_bit_exact(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    config = pretrained_config(directory, clip_grad_norm=1.0)
    trainer: Any = load_trainer(config)
    start = trainer.init_state()
    # the directory's weights, not a random initialisation
    stored = load_file(directory / "model.safetensors")
    key = "model.layers.0.mlp.up_proj.weight"
    assert np.array_equal(start.tensors[f"param/{key}"], stored[key].numpy())
    # its own tokenizer (never retrained) and its content hash in the lineage
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert trainer.tokenizer.encode("def f(x): return x").ids == theirs("def f(x): return x").input_ids
    files = [p for p in directory.iterdir() if p.name in {"config.json", "model.safetensors", *TOKENIZER_FILES}]
    assert start.lineage.model_version.endswith(f"-pretrained-{content_hash(files)}")
    assert start.lineage.dataset_version == "text-pretrained-300"

    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert straight.state.history["loss"][-1] < straight.state.history["loss"][0]
    at17 = TrainingSession.fresh("w", tmp_path / "w", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w2", config=config, weights_only_restore=True)
    weights.run(23, checkpoint_at_end=False)
    assert "cursor" in {d.field for d in compare_states(weights.state, straight.state)}


def test_a_sharded_tied_directory_loads_and_a_changed_directory_is_another_model(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "qwen", "qwen2", shard="20KB")
    assert (directory / "model.safetensors.index.json").is_file()
    trainer: Any = load_trainer(pretrained_config(directory))
    names, aliases = trainer.exchange_names()
    assert aliases == {"lm_head.weight": "param/model.embed_tokens.weight"}
    before = trainer.init_state().lineage.model_version
    tokenizer_config = directory / "tokenizer_config.json"
    body = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**body, "model_max_length": 77}))
    assert load_trainer(pretrained_config(directory)).init_state().lineage.model_version != before


def test_the_export_loads_with_from_pretrained_with_the_fine_tuned_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = save_pretrained_dir(tmp_path / "base", "llama")
    config = pretrained_config(directory)
    session = TrainingSession.fresh("ft", tmp_path / "store", config)
    done = session.run(4)
    assert done is not None
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    out = tmp_path / "out"
    code = main(["ckpt", "export", str(done.ref), str(out), "--format", "safetensors", "--config", str(config_file)])
    assert code == 0, capsys.readouterr().err
    assert (out / "tokenizer.json").read_bytes() == (directory / "tokenizer.json").read_bytes()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    model: Any = load_trainer(config)
    model.load_state(session.state)
    model.model.eval()
    batch = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    base = AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        got, want, old = exported(batch).logits, model.forward(batch), base(batch).logits
    assert torch.equal(got, want) and not torch.equal(got, old)  # the fine-tuned logits
    ids = AutoTokenizer.from_pretrained(out)("def f").input_ids
    assert ids == AutoTokenizer.from_pretrained(directory)("def f").input_ids


def _rewrite(directory: Path, change: Any) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_config(directory: Path, **fields: Any) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


REFUSALS: dict[str, tuple[str, dict[str, Any], Any, type[Exception], str]] = {
    # name: (architecture, save_pretrained_dir options, what is changed, the error, what the line names)
    "tokenizer larger than the vocabulary": ("llama", {"tokenizer_vocab": 400}, None, E.ConfigError, "tokenizer.json"),
    "config vocab_size is not the embedding's": (
        "llama",
        {},
        lambda d: _edit_config(d, vocab_size=320),
        E.TensorSpecError,
        "expected <f4[320, 32], found <f4[300, 32]",
    ),
    "a missing weight": (
        "llama",
        {},
        lambda d: _rewrite(d, lambda t: t.pop("model.norm.weight")),
        E.TensorSpecError,
        "missing ['model.norm.weight']",
    ),
    "an extra weight": (
        "llama",
        {},
        lambda d: _rewrite(d, lambda t: t.update({"model.extra.weight": torch.zeros(3)})),
        E.TensorSpecError,
        "unknown ['model.extra.weight']",
    ),
    "a tied head that differs": (
        "qwen2",
        {},
        lambda d: _rewrite(d, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1})),
        E.TensorSpecError,
        "lm_head.weight",
    ),
    "an untied config over tied weights": (
        "qwen2",
        {},
        lambda d: _edit_config(d, tie_word_embeddings=False),
        E.TensorSpecError,
        "missing ['lm_head.weight']",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_directory_whose_config_tokenizer_and_weights_disagree_is_one_typed_line(case: str, tmp_path: Path) -> None:
    arch, options, change, error, needle = REFUSALS[case]
    directory = save_pretrained_dir(tmp_path / "base", arch, **options)
    if change is not None:
        change(directory)
    with pytest.raises(error) as info:
        load_trainer(pretrained_config(directory))
    message = str(info.value)
    assert needle in message and "trainer.options.pretrained" in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"model": {"model_type": "llama"}}, "exactly one of model"),
        ({"vocab_size": 512}, "vocab_size"),
        ({"pretrained": "/no/such/directory"}, "trainer.options.pretrained"),
    ],
)
def test_refused_options_are_one_line(options: dict[str, Any], needle: str, tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    with pytest.raises(E.ConfigError) as info:
        load_trainer(pretrained_config(directory, **options))
    message = str(info.value)
    assert needle in message and "\n" not in message, message
