"""``init_from.safetensors``: a new stage from a directory ``save_pretrained`` wrote (or a plain
safetensors file) starts from exactly its weights, trains, and records the directory's content
hash; a directory of another shape or dtype, with a foreign or missing tensor, or a tied weight
that differs, is refused with a typed error before the run holds any state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cairn import errors as E
from cairn.checkpoint import latest_committed
from cairn.config import TrainConfig
from cairn.interop.weights import content_hash
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch.state_io import to_numpy
from tests.conftest import HF_MODELS, hf_config

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402


def pretrained(tmp_path: Path, arch: str = "gpt2", seed: int = 99, **options: object) -> Path:
    """A Hugging Face directory of the tiny ``arch`` with other weights than a fresh run's."""
    trainer = load_trainer(hf_config(arch, seed=seed, **options))
    out = tmp_path / f"pretrained-{arch}"
    trainer.model.save_pretrained(out)  # type: ignore[attr-defined]
    return out


def staged(source: Path, arch: str = "gpt2", **options: object) -> TrainConfig:
    base = hf_config(arch, **options).model_dump(mode="json")
    return TrainConfig.model_validate({**base, "stage": "finetune", "init_from": {"safetensors": str(source)}})


def test_a_stage_starts_from_a_save_pretrained_directory_and_records_its_hash(tmp_path: Path) -> None:
    source = pretrained(tmp_path)
    session = TrainingSession.fresh("ft", tmp_path / "store", staged(source))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(source).state_dict()
    for key, tensor in theirs.items():
        if key != "lm_head.weight":  # tied: the embedding
            assert np.array_equal(session.state.tensors[f"param/{key}"], to_numpy(tensor)), key
    fresh = load_trainer(hf_config("gpt2")).init_state()
    wte = "param/transformer.wte.weight"
    assert not np.array_equal(session.state.tensors[wte], fresh.tensors[wte])
    reference = session.state.lineage.reference
    assert reference is not None and reference.checkpoint == f"safetensors:{source.resolve()}"
    assert reference.fingerprint == content_hash([*source.glob("*.safetensors"), source / "config.json"])
    assert session.state.step == 0 and session.state.history["loss"] == []
    session.run(5)
    assert session.state.step == 5
    latest = latest_committed(session.store, "ft")
    assert latest is not None
    resumed = TrainingSession.from_checkpoint(latest, config=staged(source))
    assert resumed.state.lineage.reference == reference


def test_a_bf16_llama_stage_from_a_plain_safetensors_file(tmp_path: Path) -> None:
    trainer = load_trainer(hf_config("llama", seed=3, param_dtype="bfloat16"))
    file = tmp_path / "weights.safetensors"
    save_file(trainer.model.state_dict(), str(file))  # type: ignore[attr-defined]
    session = TrainingSession.fresh("ft", tmp_path / "store", staged(file, "llama", param_dtype="bfloat16"))
    got = session.state.tensors["param/model.embed_tokens.weight"]
    assert got.dtype.name == "bfloat16"
    assert got.tobytes() == to_numpy(trainer.model.get_input_embeddings().weight).tobytes()  # type: ignore[attr-defined]


def refused(tmp_path: Path, config: TrainConfig) -> E.CairnError:
    with pytest.raises(E.CairnError) as info:
        TrainingSession.fresh("ft", tmp_path / "store", config)
    assert latest_committed(LocalStore(tmp_path / "store"), "ft") is None
    assert "\n" not in str(info.value)
    return info.value


def test_another_shape_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    source = pretrained(tmp_path, model={**HF_MODELS["gpt2"], "n_embd": 64})
    error = refused(tmp_path, staged(source))
    assert isinstance(error, E.TensorSpecError)
    assert "expected <f4[" in str(error) and "found <f4[" in str(error) and "init_from.safetensors: " in str(error)


def test_another_dtype_is_refused(tmp_path: Path) -> None:
    source = pretrained(tmp_path, param_dtype="bfloat16")
    error = refused(tmp_path, staged(source))
    assert isinstance(error, E.TensorSpecError) and "expected <f4" in str(error) and "found bfloat16" in str(error)


@pytest.mark.parametrize("change", ["foreign", "missing", "untied"])
def test_a_foreign_missing_or_untied_tensor_is_refused(tmp_path: Path, change: str) -> None:
    trainer = load_trainer(hf_config("gpt2", seed=5))
    tensors = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}  # type: ignore[attr-defined]
    if change == "foreign":
        tensors["classifier.weight"] = torch.zeros(2, 2)
    elif change == "missing":
        del tensors["transformer.ln_f.bias"]
    else:
        tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    file = tmp_path / "w.safetensors"
    save_file(tensors, str(file))
    error = refused(tmp_path, staged(file))
    assert isinstance(error, E.TensorSpecError)
    needle = {"foreign": "classifier.weight", "missing": "transformer.ln_f.bias", "untied": "lm_head.weight"}[change]
    assert needle in str(error)
