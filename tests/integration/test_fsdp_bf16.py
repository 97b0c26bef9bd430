"""FSDP2's mixed-precision policy (``distributed.param_dtype: bfloat16``: bf16 compute, fp32
reduction, fp32 parameters and optimizer state) on a 2-rank gang (CPU, gloo), on the docs'
two-block Llama built from its config (the digits CNN's BatchNorm refuses bf16 compute):

- the seed fixture: 5 updates, a new gang restoring them, 7 more == 12 straight, bit for bit;
- the checkpoint records the policy, keeps its weights and moments in float32, and the run
  differs from the same run in fp32 (the policy took effect: the loss is not the fp32 one);
- the 5-update checkpoint continued at 4 ranks: its training loss stays within the FSDP
  contract across world sizes (``TOLERANCE``, the fp32 one) of the straight 2-rank run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cairn.checkpoint import list_checkpoints
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.gang.job import GangJob, RankResult
from cairn.gang.launch import Gang, GangSpec
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.integration.test_fsdp_temporal import TOLERANCE, llama_fsdp

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")

RUN = "llama-bf16"


def config(param_dtype: str | None) -> TrainConfig:
    body: dict[str, Any] = json.loads(json.dumps(llama_fsdp().to_json()))
    body["distributed"]["param_dtype"] = param_dtype
    return parse_config(body)


def gang(store: Path, workdir: Path, cfg: TrainConfig, target: int, world: int = 2) -> RankResult:
    body = GangJob(run_id=RUN, store=str(store), config=cfg, target_step=target, checkpoint_every=5)
    runner = Gang(GangSpec(nproc_per_node=world), body, workdir)
    runner.start()
    return runner.supervise(on_progress=lambda doc: None, cancelled=lambda: False)


def last(store: Path, cfg: TrainConfig) -> tuple[Any, Any]:
    local = LocalStore(store)
    ref = max(list_checkpoints(local, RUN), key=lambda r: r.step)
    return read_manifest(local, ref, expect_kind=None), load_training(local, ref, run_config=cfg)[0]


def test_bf16_compute_resumes_bit_exact_and_keeps_fp32_state(tmp_path: Path) -> None:
    bf16 = config("bfloat16")
    for name in ("straight", "resumed", "fp32"):
        (tmp_path / name).mkdir()
    gang(tmp_path / "straight", tmp_path / "w1", bf16, 12)
    first = gang(tmp_path / "resumed", tmp_path / "w2", bf16, 5)
    shutil.copytree(tmp_path / "resumed", tmp_path / "at-4-ranks")  # the 5-update checkpoint, continued at W=4 below
    second = gang(tmp_path / "resumed", tmp_path / "w3", bf16, 12)
    assert (first.step, second.resumed_from_step, second.step) == (5, 5, 12)
    straight, resumed = last(tmp_path / "straight", bf16), last(tmp_path / "resumed", bf16)
    assert resumed[0].fingerprint == straight[0].fingerprint  # 5 + 7 == 12, bit for bit
    manifest, state = straight
    assert manifest.meta["runtime"]["sharding"]["param_dtype"] == "bfloat16"
    weights = {n: a for n, a in state.tensors.items() if n.startswith(("param/", "optim/"))}
    floats = {n: a.dtype for n, a in weights.items() if a.dtype.kind == "f"}
    assert floats and set(floats.values()) == {np.dtype(np.float32)}  # parameters and moments stay fp32
    fp32_config = config(None)
    gang(tmp_path / "fp32", tmp_path / "w4", fp32_config, 12)
    _, fp32 = last(tmp_path / "fp32", fp32_config)
    assert fp32.history["loss"][0] != state.history["loss"][0]  # bf16 compute took effect
    difference = max(abs(a - b) / abs(b) for a, b in zip(state.history["loss"], fp32.history["loss"], strict=True))
    print(f"bf16 compute vs fp32: largest relative loss difference over 12 steps {difference:.2e}")
    assert difference < 0.05  # the same training, in another precision

    continued = gang(tmp_path / "at-4-ranks", tmp_path / "w5", bf16, 12, world=4)
    assert (continued.resumed_from_step, continued.step) == (5, 12)
    manifest4, state4 = last(tmp_path / "at-4-ranks", bf16)
    assert manifest4.writer.ranks == 4 and manifest4.meta["runtime"]["sharding"]["world_size"] == 4
    losses = list(zip(state4.history["loss"], state.history["loss"], strict=True))
    assert all(a == b for a, b in losses[:5])  # the history it resumed from
    across = max(abs(a - b) / abs(b) for a, b in losses[5:])
    print(f"bf16 compute, W=2 -> W=4 at step 5: largest relative loss difference over steps 6-12 {across:.2e}")
    assert across < TOLERANCE
