"""The GPU path, on a machine with CUDA (``make gpu-check``; they skip elsewhere): the seed
fixture on CUDA for the digits CNN and a Hugging Face GPT-2 (parameters, AdamW moments, the
schedule, every RNG state including the GPU's, the cursor), staged through reused pinned host
buffers; an export whose ``from_pretrained`` gives the same logits on the GPU; a W = 2 NCCL
gang resumed at W = 1 (with two GPUs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from cairn.checkpoint import CheckpointRef, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.manifest import CheckpointKind
from cairn.config import parse_config
from cairn.distributed.comm import SoloComm
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec
from cairn.gang.rank import run_rank
from cairn.interop.export import export_checkpoint
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.training import load_training
from tests.conftest import digits_config, digits_dp_config, hf_config, seed_fixture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU: run `make gpu-check` on a machine with one"
    ),
]


@pytest.mark.parametrize("which", ["digits", "hf-gpt2"])
def test_the_seed_fixture_on_cuda_is_bit_exact(which: str, tmp_path: Path) -> None:
    config = digits_config(device="cuda") if which == "digits" else hf_config("gpt2", device="cuda")
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert "rng/cuda" in resumed.state.tensors
    assert resumed.state.meta["runtime"]["gpu"] == torch.cuda.get_device_name()
    trainer = resumed.trainer
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())  # type: ignore[attr-defined]
    staging = trainer.staging  # type: ignore[attr-defined]
    on_gpu = [*trainer.model.parameters(), *trainer.model.buffers()]  # type: ignore[attr-defined]
    on_gpu += [v for st in trainer.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]  # type: ignore[attr-defined]
    assert staging.allocations == sum(
        t.is_cuda for t in on_gpu
    )  # one buffer each, reused (Adam's step stays on the CPU)
    assert all(b.is_pinned() for b in staging._buffers.values())


def test_an_export_from_a_cuda_run_gives_the_same_logits_on_the_gpu(tmp_path: Path) -> None:
    import transformers

    config = hf_config("gpt2", device="cuda")
    result = TrainingSession.fresh("run", tmp_path / "store", config).run(12)
    assert result is not None
    store = LocalStore(tmp_path / "store")
    manifest = read_manifest(store, result.ref, expect_kind=CheckpointKind.TRAINING)
    trainer = load_trainer(config)
    export_checkpoint(store, result.ref, manifest, trainer, tmp_path / "out")
    state, _ = load_training(store, result.ref, run_config=config)
    trainer.load_state(state)  # type: ignore[attr-defined]
    trainer.model.eval()  # type: ignore[attr-defined]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").to("cuda").eval()
    batch = torch.randint(0, 300, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(batch).logits, trainer.forward(batch))  # type: ignore[attr-defined]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="an NCCL gang of two needs two GPUs")
def test_an_nccl_gang_of_two_resumed_at_one(tmp_path: Path) -> None:
    body = digits_dp_config(device="cuda").to_json()
    config = parse_config(body)
    store = tmp_path / "store"
    store.mkdir()
    job = GangJob(run_id="dp", store=str(store), config=config, target_step=6, checkpoint_every=3)
    gang = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "w2")
    gang.start()
    result = gang.supervise(on_progress=lambda doc: None, cancelled=lambda: False)
    assert (result.world_size, result.step) == (2, 6)
    run_rank(SoloComm(), job.model_copy(update={"target_step": 12}), tmp_path / "w1")
    local = LocalStore(store)
    resumed, _ = load_training(local, CheckpointRef(local.url, "dp", CheckpointKind.TRAINING, 12), run_config=config)
    straight = TrainingSession.fresh("s", tmp_path / "s", config)
    straight.run(12, checkpoint_at_end=False)
    assert compare_states(resumed, straight.state) == []


def test_a_one_rank_fsdp_gang_on_nccl_resumes_bit_exact(tmp_path: Path) -> None:
    """FSDP2 on CUDA over NCCL (one GPU: a gang of one rank under torchrun, the CPU/gloo tests'
    path with ``cuda:LOCAL_RANK``): 5 updates, a new gang restoring that checkpoint, 7 more,
    equal 12 straight, bit for bit; the checkpoint records the sharding."""
    body = digits_dp_config(device="cuda").to_json()
    body["distributed"]["strategy"] = "fsdp"
    config = parse_config(body)

    def gang(store: Path, target: int, workdir: Path) -> Any:
        job = GangJob(run_id="fsdp", store=str(store), config=config, target_step=target, checkpoint_every=5)
        g = Gang(GangSpec(nproc_per_node=1), job, workdir)
        g.start()
        return g.supervise(on_progress=lambda doc: None, cancelled=lambda: False)

    (tmp_path / "run").mkdir()
    (tmp_path / "straight").mkdir()
    first = gang(tmp_path / "run", 5, tmp_path / "w1")
    resumed = gang(tmp_path / "run", 12, tmp_path / "w2")
    straight = gang(tmp_path / "straight", 12, tmp_path / "w3")
    assert (first.step, resumed.resumed_from_step, resumed.step, straight.step) == (5, 5, 12, 12)
    assert resumed.fingerprint == straight.fingerprint
    local = LocalStore(tmp_path / "run")
    manifest = read_manifest(local, CheckpointRef.parse(resumed.checkpoint), expect_kind=CheckpointKind.TRAINING)
    runtime = manifest.meta["runtime"]
    assert runtime["sharding"]["strategy"] == "fsdp" and runtime["sharding"]["world_size"] == 1, runtime
    assert "cuda" in json.dumps(runtime), runtime  # computed on the GPU, and recorded so
