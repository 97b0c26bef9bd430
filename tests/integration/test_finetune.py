"""The fine-tuning example, as a user runs it: a pretrained directory and an instruction JSONL
file (``examples/finetune.py`` makes both locally), fine-tuned with LoRA and in full, durably on
Temporal (``examples/finetune-run.json``) with the worker SIGKILLed mid-epoch, logged to
TensorBoard: the run ends on the bits of an uninterrupted in-process run, TensorBoard holds each
committed step once, and the export loads with ``from_pretrained`` (and, for LoRA, as a PEFT
adapter) with the fine-tuned logits."""

from __future__ import annotations

import asyncio
import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

pytest.importorskip("peft")

import torch

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.stores import LocalStore
from cairn.training import load_training
from examples.finetune import instructions, save_base
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, kill_after_commit, reference, start_worker_process
from tests.unit.trackers.conftest import once, tensorboard_steps
from workers.cli.main import main
from workers.stack.servers import ServerProcess
from workflows.training_run import TrainingRun

pytestmark = [pytest.mark.integration, pytest.mark.drill]
EXAMPLE = "/tmp/cairn-finetune"
"""Where the shipped example files put the base, the data and the TensorBoard logs."""


def example_run(tmp_path: Path, lora: bool) -> TrainingRunInput:
    """``examples/finetune-run.json`` with its paths moved into ``tmp_path`` (and, for a full
    fine-tune, the config of ``examples/finetune.json``), two epochs long."""
    text = (REPO / "examples" / "finetune-run.json").read_text().replace(EXAMPLE, str(tmp_path))
    body = json.loads(text)
    if not lora:
        body["config"] = json.loads((REPO / "examples" / "finetune.json").read_text().replace(EXAMPLE, str(tmp_path)))
    body.update(run_id=f"ft-{'lora' if lora else 'full'}-{uuid.uuid4().hex[:6]}", store=str(tmp_path / "store"))
    body.update(total_epochs=2)
    return TrainingRunInput.model_validate(body)


def logits(model: Any, tokenizer_dir: Path) -> torch.Tensor:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)("What is 3 plus 4?", return_tensors="pt")
    with torch.no_grad():
        return model(ids.input_ids).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
async def test_the_fine_tuning_example_survives_a_sigkill_and_exports_a_loadable_model(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path, lora: bool
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    save_base(tmp_path / "base")
    instructions(tmp_path / "instructions.jsonl")
    inp = example_run(tmp_path, lora)
    per_epoch = inp.config.trainer.options["epoch_steps"]
    preload = ("--preload", "cairn.trainers.hf")
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log", extra=preload)
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await kill_after_commit(first, LocalStore(inp.store), inp.run_id, 10)  # mid-way through epoch 1
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log", extra=preload)
        straight = asyncio.create_task(asyncio.to_thread(reference, inp.config, 2 * per_epoch))
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    expected = await straight
    assert summary.steps == 2 * per_epoch and summary.attempts[0] >= 2, summary  # the killed segment ran again
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, _ = load_training(LocalStore(ref.store_url), ref, run_config=inp.config)
    assert compare_states(state, expected.state) == []
    once(tensorboard_steps(tmp_path / "tensorboard", inp.run_id), ("loss", "lr"), 2 * per_epoch)

    config = tmp_path / "config.json"
    config.write_text(json.dumps(inp.config.to_json()))
    merged = tmp_path / "merged"
    assert main(["ckpt", "export", str(ref), str(merged), "--format", "safetensors", "--config", str(config)]) == 0
    fine_tuned = logits(AutoModelForCausalLM.from_pretrained(merged, local_files_only=True), merged)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", local_files_only=True, attn_implementation="eager")
    assert not torch.allclose(fine_tuned, logits(base, tmp_path / "base"))  # the export is the fine-tuned model
    if lora:
        adapter = tmp_path / "adapter"
        assert main(["ckpt", "export", str(ref), str(adapter), "--format", "peft", "--config", str(config)]) == 0
        with warnings.catch_warnings():  # peft asks transformers a question transformers 5 deprecated
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            loaded = PeftModel.from_pretrained(base, adapter)
        torch.testing.assert_close(logits(loaded, adapter), fine_tuned)
