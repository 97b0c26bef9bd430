"""The PyTorch adapter (the digits CNN: BatchNorm, dropout, AdamW, a cosine schedule) as a gang of
rank processes under torchrun: W=2 from scratch, then W=4 resuming the W=2 checkpoint, commit
exactly the checkpoints of the one-process reference (W=1, ``SoloComm``), step for step; with
the rank-order sum switched on, W=4 and W=1 part ways after the first update."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairn.checkpoint import CheckpointRef, list_checkpoints
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig
from cairn.distributed.comm import SoloComm
from cairn.gang.job import GangJob, RankResult
from cairn.gang.launch import Gang, GangSpec
from cairn.gang.rank import run_rank
from cairn.stores import LocalStore
from tests.conftest import digits_dp_config

pytestmark = pytest.mark.integration

RUN = "digits-dp"
STEPS = 6
EVERY = 3


def job(store: Path, config: TrainConfig, target: int, **extra: Any) -> GangJob:
    return GangJob(run_id=RUN, store=str(store), config=config, target_step=target, checkpoint_every=EVERY, **extra)


def fingerprints(store: Path) -> dict[int, str]:
    """Every committed checkpoint of the run: step -> fingerprint."""
    local = LocalStore(store)
    return {ref.step: read_manifest(local, ref, expect_kind=None).fingerprint for ref in list_checkpoints(local, RUN)}


def solo(tmp: Path, config: TrainConfig, target: int) -> dict[int, str]:
    (tmp / "store").mkdir(parents=True)
    run_rank(SoloComm(), job(tmp / "store", config, target), tmp / "work")
    return fingerprints(tmp / "store")


def gang(world: int, store: Path, workdir: Path, config: TrainConfig, target: int, **extra: Any) -> RankResult:
    g = Gang(GangSpec(nproc_per_node=world), job(store, config, target, **extra), workdir)
    g.start()
    return g.supervise(on_progress=lambda doc: None, cancelled=lambda: False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    return solo(tmp_path_factory.mktemp("w1"), digits_dp_config(), STEPS)


@pytest.fixture(scope="module")
def w2_then_w4(tmp_path_factory: pytest.TempPathFactory) -> tuple[RankResult, RankResult, dict[int, str]]:
    """One run: W=2 trains to step 3, then W=4 restores that checkpoint and trains to step 6."""
    tmp = tmp_path_factory.mktemp("gang")
    store = tmp / "store"
    store.mkdir()
    first = gang(2, store, tmp / "w2", digits_dp_config(), EVERY)
    second = gang(4, store, tmp / "w4", digits_dp_config(), STEPS)
    return first, second, fingerprints(store)


def test_w2_then_w4_commit_the_w1_checkpoints_bit_for_bit(
    reference: dict[int, str], w2_then_w4: tuple[RankResult, RankResult, dict[int, str]]
) -> None:
    first, second, committed = w2_then_w4
    assert sorted(reference) == [0, 3, 6]
    assert committed == reference  # steps 0 and 3 written by 2 ranks, step 6 by 4
    assert (first.world_size, first.step, first.fingerprint) == (2, 3, reference[3])
    assert (second.world_size, second.resumed_from_step) == (4, 3)
    assert (second.step, second.fingerprint) == (6, reference[6])
    assert second.val_loss is not None  # an epoch ended (step 5): the evaluation is in the bits


def test_rank_order_sum_breaks_the_exactness_claim(tmp_path: Path, rank_order_sums: Callable[[], None]) -> None:
    """The same run with a left fold per rank, then across ranks (what a naive data-parallel sum
    does): the origin is shared, the first update already differs between W=1 and W=4."""
    rank_order_sums()  # this process; the gang's ranks follow their job
    config = digits_dp_config()
    w1 = solo(tmp_path / "w1", config, 1)
    (tmp_path / "store").mkdir()
    result = gang(4, tmp_path / "store", tmp_path / "w4", config, 1, reduction="rank-order")
    assert result.reduction == "rank-order"  # the ranks did sum in rank order (not the tree)
    w4 = fingerprints(tmp_path / "store")
    assert sorted(w1) == sorted(w4) == [0, 1]
    assert w4[0] == w1[0]
    assert result.fingerprint == w4[1] != w1[1]


def test_checkpoints_name_no_world_size(w2_then_w4: tuple[RankResult, RankResult, dict[int, str]]) -> None:
    """The W=2 and W=4 checkpoints differ only in who wrote which shard: the same blocked layout."""
    first, second, _ = w2_then_w4
    store = LocalStore(Path(CheckpointRef.parse(first.checkpoint).store_url))
    at3 = read_manifest(store, CheckpointRef.parse(first.checkpoint), expect_kind=None)
    at6 = read_manifest(store, CheckpointRef.parse(second.checkpoint), expect_kind=None)
    assert at3.parts is not None and at6.parts is not None
    # the same tensors with the same block sizes (the history is in run-level segments: the first
    # evaluation, at step 5, added its metric there)
    assert set(at6.parts) == set(at3.parts)
    assert {n: p.block_elems for n, p in at3.parts.items()} == {n: at6.parts[n].block_elems for n in at3.parts}
    assert at3.history is not None and at6.history is not None
    assert set(at6.history.series) - set(at3.history.series) == {"val_accuracy"}
    assert at3.indexes is not None and at6.indexes is not None
    assert [r.rank for r in at3.indexes] == [0, 1] and [r.rank for r in at6.indexes] == [0, 1, 2, 3]
    assert {s.rank for s in at3.shards} == {0, 1}
    assert {s.rank for s in at6.shards} == {0, 1, 2, 3}
