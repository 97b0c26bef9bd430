"""A Hugging Face causal LM (a tiny GPT-2 built from its config) trained durably on Temporal with
a worker SIGKILLed mid-epoch: the run ends on the bits of an uninterrupted in-process run, and
its final checkpoint exports to a directory ``from_pretrained`` loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import Client

from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import hf_config
from tests.integration.conftest import TemporalServer, killed_mid_epoch
from workers.cli.main import main

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")


@pytest.mark.drill
async def test_hf_gpt2_on_temporal_survives_a_sigkill_mid_epoch_bit_identical(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    config = hf_config("gpt2", corpus_bytes=12000, eval_every=None, clip_grad_norm=1.0, accumulation=2)
    summary, inp, per_epoch, expected = await killed_mid_epoch(
        client, temporal_server, task_queue, tmp_path, config, "hf"
    )
    assert per_epoch > 20  # the kill was mid-epoch
    assert summary.steps == summary.total_steps == 2 * per_epoch
    assert summary.attempts[0] >= 2 and summary.recomputed_steps <= inp.checkpoint.every
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref, run_config=config)
    assert compare_states(state, expected.state) == []
    assert expected.last_commit is not None and manifest.fingerprint == expected.last_commit.manifest.fingerprint
    assert state.history["val_step"] == [float(per_epoch), float(2 * per_epoch)]
    out = tmp_path / "exported"
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    assert main(["ckpt", "export", str(ref), str(out), "--format", "safetensors"]) == 2  # a checkpoint alone: untrusted
    assert (
        main(
            ["ckpt", "export", str(ref), str(out), "--format", "safetensors", "--config", str(tmp_path / "config.json")]
        )
        == 0
    )
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
