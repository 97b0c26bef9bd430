"""A model that does not fit a rank replicated trains as an FSDP gang on Temporal under that
rank's memory cap, survives a rank SIGKILL on the bits of an uninterrupted run, continues on
another number of ranks within the FSDP contract, and goes out to DCP and comes back in as a new
stage — every rank capped (CPU, gloo).

Two caps (``capped_trainer``), each on what a rank process takes beyond what it holds when its
trainer is built (imports, the process group), in full training states of the model (fp32
parameters, gradients and both Adam moments: 16 bytes a parameter; 26 M parameters, 396 MiB):

- **address space** (``RLIMIT_DATA``, private writable memory whether touched or not; runs
  everywhere): ``DATA_BUDGET`` = 2 states. Peak ``VmData`` above the baseline, measured
  uncapped: replicated 2.9 states (4 updates, 2 saves), FSDP 1.5 at 2 ranks and 1.3 at 4 (its
  save and restore included).
- **resident memory** (a memory cgroup per rank: the pages it touches, as a device counts
  them; where this process may make cgroup v1 memory groups, e.g. as root): ``RESIDENT_BUDGET``,
  **less than one state** — the model's full state does not fit in a rank. Resident pages above
  the baseline, sampled every 20 ms uncapped with 256 KiB blocks: FSDP 0.72 states at 2 ranks
  and 0.43 at 4 (a save and a restore included); the replicated control is killed by the
  kernel's OOM killer at its first update.

In both, the control (the replicated run, the same cap, the same 2 ranks) is refused by the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from temporalio.client import Client

from activities.views import RunSummary
from cairn.checkpoint import latest_committed
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec
from cairn.interop import export_dcp
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.training import load_training
from tests.conftest import REPO
from tests.integration.capped_trainer import (
    GROUP_PREFIX,
    GROUP_TOKEN,
    capped_groups,
    memory_cgroup_of,
    memory_cgroups_writable,
    oom_kills,
)
from tests.integration.conftest import TemporalServer, gang_ranks, gang_worker
from tests.integration.test_fsdp_temporal import TOLERANCE, at_step, run_input, signal_a_rank_past, training_past
from workflows.training_run import TrainingRun

pytestmark = [pytest.mark.integration, pytest.mark.drill]
pytest.importorskip("transformers")

DATA_BUDGET = 2.0
"""The address space a rank may add to its imports, in full training states (see the module)."""
RESIDENT_BUDGET = 0.9
"""The resident memory a rank may add to its imports, in full training states (see the module)."""
RESIDENT_BLOCK_BYTES = 256 << 10
"""Checkpoint blocks under the resident cap: a save's transient on a rank is up to a block per
sharded tensor whose shard boundary it owns (the blocks straddling it are assembled there); at
1 MiB that is 170 MiB on this model's rank 0 at 2 ranks (a 1.0-state peak), at 256 KiB 0.72."""
MMAP_THRESHOLD = str(128 << 10)
"""glibc's default, fixed for the ranks (``MALLOC_MMAP_THRESHOLD_``): a freed large buffer goes
back to the kernel, as it does on a device, instead of staying in the heap (``test_fsdp_memory``)."""
STEPS, MORE = 6, 8


def capped(strategy: str, cap: dict[str, int], block_bytes: int = 1 << 20, **extra: Any) -> TrainConfig:
    """An 8-block Llama (hidden 512: 26 M parameters) whose ranks are capped by ``cap`` (the
    ``capped_trainer`` option and its bytes), its checkpoints in blocks of ``block_bytes``."""
    model = {
        "model_type": "llama",
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32,
    }
    options = {"model": model, "vocab_size": 300, "context": 16, "corpus_bytes": 6000, "eval_every": None}
    return parse_config(
        {
            "seed": 17,
            "batch_size": 8,
            "trainer": {
                "factory": "tests.integration.capped_trainer:CappedCausalLM",
                "options": {**options, **cap},
            },
            "distributed": {"microbatches": 4, "strategy": strategy, "block_bytes": block_bytes},
            **extra,
        }
    )


def state_bytes() -> int:
    """The model's full training state in fp32 Adam: parameters, gradients, two moments."""
    trainer: Any = load_trainer(capped("fsdp", {}))  # built here, uncapped (no RANK)
    return 16 * sum(p.numel() for p in trainer.params.values())


def gang(tmp_path: Path, name: str, config: TrainConfig, world: int, target: int) -> LocalStore:
    """A gang of this test's own (no Temporal) writing to ``tmp_path/name``."""
    store = tmp_path / name
    store.mkdir(exist_ok=True)
    body = GangJob(run_id=name, store=str(store), config=config, target_step=target, checkpoint_every=2)
    runner = Gang(GangSpec(nproc_per_node=world), body, tmp_path / f"{name}-gang-{world}")
    runner.start()
    runner.supervise(on_progress=lambda doc: None, cancelled=lambda: False)
    return LocalStore(store)


def rank_limit(pid: int, cap: str) -> int:
    """The cap on rank process ``pid``: its ``RLIMIT_DATA`` soft limit (``data``) or its memory
    cgroup's limit (``resident``)."""
    if cap == "data":
        line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max data size"))
        soft = line.split()[3]
        return 1 << 62 if soft == "unlimited" else int(soft)
    group = memory_cgroup_of(pid)
    if group is None or not group.name.startswith(GROUP_PREFIX):
        return 1 << 62  # not in a capped group of its own
    return int((group / "memory.limit_in_bytes").read_text())


async def rank_limits(tmp_path: Path, cap: str) -> list[int]:
    """The cap on each rank of this test's gang, once it trains past step 1."""
    deadline = time.monotonic() + 240
    while not (training_past(tmp_path, 1) and len(ranks := gang_ranks(tmp_path, ranks_only=True)) == 2):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    return [rank_limit(pid, cap) for pid in ranks]


def remove_groups() -> None:
    """Remove the capped ranks' memory groups (each outlives its process)."""
    for group in capped_groups():
        with contextlib.suppress(OSError):
            group.rmdir()


@pytest.fixture(params=["data", "resident"])
def cap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kind of cap on every rank (see the module); the ranks' memory groups carry this test
    run's token and are removed afterwards."""
    if request.param == "resident" and (why := memory_cgroups_writable()) is not None:
        pytest.skip(f"resident-memory cap: {why}")
    monkeypatch.setenv(GROUP_TOKEN, uuid.uuid4().hex[:8])
    yield request.param
    remove_groups()


@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
async def test_a_model_too_big_for_a_replicated_rank_trains_survives_and_reshards_as_an_fsdp_gang(
    cap: str,
    client: Client,
    temporal_server: TemporalServer,
    task_queue: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", python_path)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    state = state_bytes()
    budget = int((DATA_BUDGET if cap == "data" else RESIDENT_BUDGET) * state)
    option = {"rank_data_budget": budget} if cap == "data" else {"rank_memory_budget": budget}
    block_bytes = 1 << 20 if cap == "data" else RESIDENT_BLOCK_BYTES
    fsdp, replicated = capped("fsdp", option, block_bytes), capped("replicated", option, block_bytes)

    # The control: replicated, the same cap, the same 2 ranks: refused at its first update
    # (address space: the allocation fails; resident memory: the kernel's OOM killer ends a rank).
    refusal = "can't allocate memory|Unable to allocate" if cap == "data" else None  # else: the OOM count below
    with pytest.raises(Exception, match=refusal) as refused:
        await asyncio.to_thread(gang, tmp_path, "replicated", replicated, 2, 2)
    print(f"replicated under the {cap} cap: {str(refused.value).splitlines()[0][:300]}")
    if cap == "resident":
        assert sum(oom_kills(group) for group in capped_groups()) >= 1  # the cap, not something else
        remove_groups()
    control = latest_committed(LocalStore(tmp_path / "replicated"), "replicated")
    assert control is None or control.step == 0  # not one update committed

    reference = await asyncio.to_thread(gang, tmp_path, "reference", fsdp, 2, MORE)
    run_id = f"capped-{uuid.uuid4().hex[:8]}"
    store = LocalStore(tmp_path / "store")
    env = {"PYTHONPATH": python_path, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    workers = [gang_worker(temporal_server, task_queue, tmp_path, n, extra=env) for n in ("host-a", "host-b")]
    try:
        # 2 ranks (one per node), capped; a rank SIGKILLed past step 4.
        first = run_input(tmp_path, run_id, fsdp, world_size=2, total_steps=STEPS, steps_per_segment=3)
        handle = await client.start_workflow(TrainingRun.run, first, id=run_id, task_queue=task_queue)
        limits = await rank_limits(tmp_path, cap)
        await signal_a_rank_past(tmp_path, 4, signal.SIGKILL)
        one = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
        # The same run at 4 ranks (two per node), capped.
        second = run_input(tmp_path, run_id, fsdp, world_size=4, total_steps=MORE, steps_per_segment=3)
        handle = await client.start_workflow(TrainingRun.run, second, id=run_id, task_queue=task_queue)
        two = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
    finally:
        for w in workers:
            w.stop()
    if cap == "data":
        assert len(limits) == 2 and all(limit <= budget + (1 << 30) for limit in limits), limits  # each rank capped
    else:
        pages = budget // resource.getpagesize() * resource.getpagesize()  # the kernel's limit, in whole pages
        assert limits == [pages, pages], limits  # each rank in a group of its own, capped below one state
        assert all(oom_kills(group) == 0 for group in capped_groups())  # no rank was near the cap's end
        peaks = [int((group / "memory.max_usage_in_bytes").read_text()) for group in capped_groups()]
        shown = sorted(round(p / state, 2) for p in peaks)  # page cache included: the kernel reclaims it at the limit
        print(f"each rank's peak charge (resident + page cache), in states: {shown}")
    assert one.steps == STEPS and one.world_size == 2 and one.retried_segments >= 1
    straight = read_manifest(reference, at_step(reference, "reference", STEPS), expect_kind=None)
    assert one.fingerprint == straight.fingerprint  # the kill cost no bit
    assert two.steps == MORE and two.world_size == 4
    assert gang_ranks(tmp_path) == []
    latest = latest_committed(store, run_id)
    assert latest is not None and latest.step == MORE
    assert read_manifest(store, latest, expect_kind=None).writer.ranks == 4
    mine, _ = load_training(store, latest, run_config=fsdp)
    theirs, _ = load_training(reference, at_step(reference, "reference", MORE), run_config=fsdp)
    losses = list(zip(mine.history["loss"], theirs.history["loss"], strict=True))
    assert all(a == b for a, b in losses[:STEPS])
    difference = max(abs(a - b) / abs(b) for a, b in losses[STEPS:])
    assert difference < TOLERANCE

    # Out to DCP (one uncapped process, as `cairn ckpt export --format dcp`), read by dcp.load ...
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "dcp"
    export_dcp(mine, load_trainer(fsdp), out)
    names = {n.removeprefix("param/"): a for n, a in mine.tensors.items() if n.startswith("param/")}
    loaded = {"model": {k: torch.zeros(a.shape, dtype=torch.float32) for k, a in names.items()}}
    dcp.load(loaded, checkpoint_id=str(out))
    assert all(loaded["model"][k].numpy().tobytes() == a.tobytes() for k, a in names.items())
    # ... and back in: a new stage on those weights, trained by a capped 2-rank FSDP gang.
    stage = capped("fsdp", option, block_bytes, stage="import", init_from={"dcp": str(out)})
    staged = await asyncio.to_thread(gang, tmp_path, "staged", stage, 2, 2)
    first_commit = latest_committed(staged, "staged")
    assert first_commit is not None and first_commit.step == 2
    lineage = read_manifest(staged, first_commit, expect_kind=None).lineage
    assert lineage.reference is not None and lineage.reference.checkpoint == f"dcp:{out.resolve()}"
    print(
        f"state {state >> 20} MiB, {cap} cap {budget >> 20} MiB a rank; W=2 -> W=4 largest relative loss "
        f"difference {difference:.2e}"
    )
