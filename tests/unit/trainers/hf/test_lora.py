"""LoRA adapters on a frozen pretrained base: the base never moves and the optimizer holds the
adapters only; a resume is bit for bit (17 + 23 == 40; weights alone diverge); incremental
checkpoints write the base once; the adapters export as a PEFT directory and merged as a Hugging
Face directory, each loadable with the trained logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

import numpy as np
import torch
from safetensors.torch import load_file

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointOptions, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.reuse import referenced_of
from cairn.session import TrainingSession
from cairn.stores import open_store
from cairn.trainers.loading import load_trainer
from tests.conftest import seed_fixture
from tests.unit.trainers.hf.conftest import pretrained_config, save_pretrained_dir
from workers.cli.main import main

LORA = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}


def test_a_lora_fine_tune_freezes_the_base_and_resumes_bit_exact(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    config = pretrained_config(directory, lora=LORA, lr=0.01, warmup=4)
    trainer: Any = load_trainer(config)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for n, p in trainer.model.named_parameters() if n in trainable}

    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    state = straight.state
    assert state.history["loss"][-1] < state.history["loss"][0]
    optim = {n.rsplit("/", 1)[0].removeprefix("optim/") for n in state.tensors if n.startswith("optim/")}
    assert optim == trainable  # moments of the adapters only
    stored = load_file(directory / "model.safetensors")
    base = "param/base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert np.array_equal(state.tensors[base], stored["model.layers.0.self_attn.q_proj.weight"].numpy())
    lora_b = "param/base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    assert np.any(state.tensors[lora_b] != 0)  # the adapters trained (B starts at zero)
    at17 = TrainingSession.fresh("w", tmp_path / "w", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w2", config=config, weights_only_restore=True)
    weights.run(23, checkpoint_at_end=False)
    assert "cursor" in {d.field for d in compare_states(weights.state, straight.state)}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_the_adapters_export_for_peft_and_merged_for_from_pretrained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    directory = save_pretrained_dir(tmp_path / "base", "llama")
    config = pretrained_config(directory, lora=LORA)
    session = TrainingSession.fresh("lora", tmp_path / "store", config)
    done = session.run(4)
    assert done is not None
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))

    def export(fmt: str, out: Path) -> None:
        code = main(["ckpt", "export", str(done.ref), str(out), "--format", fmt, "--config", str(config_file)])
        assert code == 0, capsys.readouterr().err

    export("peft", tmp_path / "adapter")
    export("safetensors", tmp_path / "merged")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "adapter").iterdir()}
    trained: Any = load_trainer(config)
    trained.load_state(session.state)
    trained.model.eval()
    batch = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    base = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager")  # as trained
    adapter = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        want = trained.forward(batch)
        got_adapter = adapter(input_ids=batch).logits
        got_merged = merged(batch).logits
        merged_here = trained.model.merge_and_unload()(batch).logits
    assert torch.equal(got_adapter, want)
    assert torch.equal(got_merged, merged_here)  # the same merge, bit for bit
    torch.testing.assert_close(got_merged, want)  # W + BA equals the adapted forward up to rounding
    base_logits = AutoModelForCausalLM.from_pretrained(directory).eval()(batch).logits.detach()
    assert not torch.equal(got_merged, base_logits)


def test_peft_format_is_refused_for_a_run_without_adapters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    config = pretrained_config(directory)
    done = TrainingSession.fresh("full", tmp_path / "store", config).run(1)
    assert done is not None
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    words = ["ckpt", "export", str(done.ref), str(tmp_path / "o"), "--format", "peft", "--config", str(config_file)]
    assert main(words) == 2
    assert "--format peft: expected a run with LoRA adapters" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


SMALL_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32,
    "tie_word_embeddings": False,
}


def written_per_checkpoint(config: Any, store: Path) -> int:
    """Bytes the second of two incremental checkpoints wrote itself."""
    session = TrainingSession.fresh("run", store, config, options=CheckpointOptions(incremental=True))
    assert session.run(2) is not None
    second = session.run(2)
    assert second is not None
    manifest = read_manifest(open_store(second.ref.store_url), second.ref, expect_kind=CheckpointKind.TRAINING)
    return referenced_of(manifest).written_bytes


def test_incremental_lora_checkpoints_write_a_tenth_of_a_full_fine_tunes(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama", arch_fields=SMALL_LLAMA)
    lora = written_per_checkpoint(pretrained_config(directory, lora={"r": 8}), tmp_path / "lora")
    full = written_per_checkpoint(pretrained_config(directory), tmp_path / "full")
    print(f"bytes written per checkpoint: LoRA r8 {lora}, full {full}, ratio {lora / full:.4f}")
    assert lora * 10 <= full


def test_a_lora_config_the_model_refuses_is_one_line(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    with pytest.raises(E.ConfigError) as info:
        load_trainer(pretrained_config(directory, lora={"target_modules": ["no_such_proj"]}))
    message = str(info.value)
    assert "trainer.options.lora" in message and "\n" not in message, message
