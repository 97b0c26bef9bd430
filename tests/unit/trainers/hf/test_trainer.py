"""The Hugging Face trainer: a tiny GPT-2 and a tiny Llama built from configs resume bit for bit
(17 + 23 == 40: parameters, AdamW moments, the schedule, RNG states, the cursor), with the
adapter's options (bf16 weights, clipping, accumulation); weights alone diverge; bad options are
typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn import errors as E
from cairn.checkpoint.compare import compare_states
from cairn.config import parse_config
from cairn.session import TrainingSession
from cairn.trainers.loading import SHIPPED_TRAINERS, load_trainer, require_trusted
from tests.conftest import REPO, hf_config, seed_fixture

pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("gpt2", {"clip_grad_norm": 1.0, "accumulation": 2}),
        ("llama", {"param_dtype": "bfloat16", "clip_grad_norm": 0.5}),
    ],
)
def test_a_tiny_causal_lm_resumes_bit_exact_and_weights_alone_diverge(
    model: str, options: dict[str, object], tmp_path: Path
) -> None:
    config = hf_config(model, **options)
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    state = straight.state
    assert state.history["val_step"] == [10.0, 20.0, 30.0, 40.0]
    assert {"val_loss", "val_accuracy", "val_perplexity"} <= set(state.history)
    assert state.history["loss"][-1] < state.history["loss"][0]  # it learns
    names = set(state.tensors)
    assert {"rng/torch", "rng/numpy"} <= names and any(n.startswith("optim/") for n in names)
    if options.get("param_dtype") == "bfloat16":
        assert state.tensors["param/model.embed_tokens.weight"].dtype.name == "bfloat16"
    # the comparison can fail: restoring the weights alone is not a resume
    at17 = TrainingSession.fresh("w", tmp_path / "w", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w2", config=config, weights_only_restore=True)
    weights.run(23, checkpoint_at_end=False)
    assert "cursor" in {d.field for d in compare_states(weights.state, straight.state)}


def test_tied_embeddings_are_one_tensor_in_the_checkpoint_and_an_alias_for_exchange() -> None:
    trainer = load_trainer(hf_config("gpt2"))
    names, aliases = trainer.exchange_names()
    assert aliases == {"lm_head.weight": "param/transformer.wte.weight"}
    assert "lm_head.weight" not in names and names["transformer.wte.weight"] == "param/transformer.wte.weight"
    assert "param/lm_head.weight" not in trainer.init_state().tensors


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"n_layer": 1}, "model_type"),
        ({"model_type": "gpt2", "vocab_size": 999}, "vocab_size"),
        ({"model_type": "no-such-architecture"}, "trainer.options.model"),
        ({"model_type": "gpt2", "n_positions": 8}, "max_position_embeddings"),
    ],
)
def test_a_bad_model_config_is_one_typed_line(model: dict[str, object], needle: str) -> None:
    with pytest.raises(E.ConfigError) as info:
        load_trainer(hf_config("gpt2", model=model))
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_the_shipped_examples_build_and_a_checkpoint_alone_cannot_choose_the_model() -> None:
    # its options name any model size and any local files: only the run's config may choose them
    assert "cairn.trainers.hf:HFCausalLM" not in SHIPPED_TRAINERS
    with pytest.raises(E.ConfigError, match="not trusted"):
        require_trusted(hf_config("gpt2"), None)
    for name in ("hf-gpt2.json", "hf-llama.json"):
        body = json.loads((REPO / "examples" / name).read_text())
        body["trainer"]["options"]["corpus_bytes"] = 20_000
        trainer = load_trainer(parse_config(body))
        assert trainer.init_state().step == 0
        files = trainer.exchange_files()
        assert files is not None and {"config.json", "tokenizer.json"} <= set(files)
