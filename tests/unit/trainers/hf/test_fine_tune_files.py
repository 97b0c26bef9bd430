"""A pretrained directory fine-tuned on an instruction JSONL file streamed with resumable state:
the HF trainer's ``data`` option. It resumes bit for bit (17 + 23 == 40, across an epoch boundary,
with shuffling, LoRA on), trains on the replies only, and a data file changed under a run is
refused on resume in one typed line naming the file as the config does (``trainer.options.data.files[0]``),
as is a malformed one (``trainer.options.val_data.files[0]``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from cairn import errors as E
from cairn.checkpoint.compare import compare_states
from cairn.session import TrainingSession
from cairn.trainers.loading import load_trainer
from tests.conftest import seed_fixture
from tests.unit.trainers.hf.conftest import pretrained_config, save_pretrained_dir


def instructions(path: Path, n: int = 24) -> Path:
    with path.open("w") as out:
        for i in range(n):
            record = {"prompt": f"add {i} and {i + 1}", "response": f"{i} plus {i + 1} is {2 * i + 1}"}
            out.write(json.dumps(record) + "\n")
    return path


def files_config(tmp_path: Path, **options: Any) -> Any:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    data = {"files": [str(instructions(tmp_path / "train.jsonl"))], "records": "instruction", "context": 16,
            "shuffle_buffer": 4, "hash_cache": str(tmp_path / "hash-cache")}  # fmt: skip
    return pretrained_config(directory, data=data, epoch_steps=6, **options)


def test_a_fine_tune_on_an_instruction_file_resumes_bit_exact_and_trains_on_replies(tmp_path: Path) -> None:
    config = files_config(tmp_path, lora={"r": 4, "alpha": 8})
    trainer: Any = load_trainer(config)
    x, y = trainer.splits["train"].next_batch()
    assert x.shape == y.shape == (config.batch_size, 16)
    assert (y == -100).any() and (y != -100).any()  # prompts masked, replies trained
    straight, resumed = seed_fixture(config, tmp_path)  # 40 updates: past the epoch boundary at 6, 12, ...
    assert compare_states(resumed.state, straight.state) == []
    assert straight.state.lineage is not None and straight.state.lineage.dataset_version.endswith("-files-instruction")


def test_a_data_file_changed_under_the_run_is_refused_on_resume(tmp_path: Path) -> None:
    config = files_config(tmp_path)
    at5 = TrainingSession.fresh("r", tmp_path / "store", config).run(5)
    assert at5 is not None
    data = tmp_path / "train.jsonl"
    then = hashlib.sha256(data.read_bytes()).hexdigest()
    with data.open("a") as out:
        out.write(json.dumps({"prompt": "new", "response": "record"}) + "\n")
    with pytest.raises(E.IncompatibleConfigError) as refused:
        TrainingSession.from_checkpoint(at5.ref, run_id="r", config=config)
    assert str(refused.value).startswith(
        f"trainer.options.data.files[0] ({data}): changed since the checkpoint was written; nothing was loaded "
        f"(expected sha256:{then[:12]}, found sha256:"
    )
    assert "\n" not in str(refused.value)


def test_a_malformed_validation_file_is_refused_naming_val_data(tmp_path: Path) -> None:
    bad = tmp_path / "val.jsonl"
    bad.write_text(json.dumps({"prompt": "add 1 and 2", "response": "3"}) + "\n" + '{"prompt": "add"\n')
    val = {"files": [str(bad)], "records": "instruction", "context": 16, "hash_cache": str(tmp_path / "hash-cache")}
    trainer: Any = load_trainer(files_config(tmp_path, val_data=val))
    with pytest.raises(E.ConfigError) as refused:
        trainer.evaluate(trainer.init_state(), "val")
    where = f"trainer.options.val_data.files[0] ({bad}), line 2: expected a JSON object"
    assert str(refused.value).startswith(where) and "\n" not in str(refused.value)


def test_data_without_epoch_steps_or_val_data_alone_is_one_line(tmp_path: Path) -> None:
    directory = save_pretrained_dir(tmp_path / "base", "llama")
    data = {"files": [str(instructions(tmp_path / "t.jsonl"))], "records": "instruction"}
    for options, needle in (({"data": data}, "epoch_steps"), ({"val_data": data}, "val_data needs data")):
        with pytest.raises(E.ConfigError) as refused:
            load_trainer(pretrained_config(directory, **options))
        assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_a_model_built_from_a_config_keeps_the_version_its_checkpoints_were_written_with() -> None:
    """The model version is in every checkpoint's lineage: a change refuses every older checkpoint."""
    from tests.conftest import hf_config

    trainer: Any = load_trainer(hf_config("gpt2"))
    assert trainer.init_state().lineage.model_version == PINNED_GPT2_VERSION


PINNED_GPT2_VERSION = "hf-gpt2-4420afb4b7dd-float32"
"""``hf_config("gpt2")``'s model version as Cairn 0.1.0 wrote it (before pretrained directories)."""
