"""The pieces of distributed training that need no second process: the canonical tree
reduction, the blocked checkpoint layout (format v2), ownership slices, the ZeRO-1 engine at
W=1 against the single-process trainer, input validation, and the gang's process hygiene."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from activities.models import TrainingRunInput
from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, load_training, read_manifest
from cairn.checkpoint.blocks import block_name, check_parts, parts_of, plan_blocks, split_blocks
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.layout import manifest_key
from cairn.config import TrainConfig
from cairn.distributed.comm import SoloComm
from cairn.distributed.partition import flat_layout
from cairn.distributed.reduce import combine, tree_sum
from cairn.errors import (
    ConfigError,
    FormatVersionError,
    GangFailedError,
    IntegrityError,
    ManifestError,
    TensorSpecError,
    error_named,
)
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec, gang_processes, reap
from cairn.gang.rank import run_rank
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from tests.conftest import small_config


def dist_config(microbatches: int = 8, block_bytes: int = 64, **overrides: object) -> TrainConfig:
    body = small_config().model_dump(mode="json")
    body.update(batch_size=16, distributed={"microbatches": microbatches, "block_bytes": block_bytes})
    body.update(overrides)
    return TrainConfig.model_validate(body)


# -- the canonical reduction ----------------------------------------------------------------------
def test_subtrees_combined_in_tree_order_equal_the_whole_tree_for_every_world_size() -> None:
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8) for _ in range(16)]
    whole = tree_sum(grads)
    for world in (1, 2, 4, 8, 16):
        per = 16 // world
        partials = [tree_sum(grads[r * per : (r + 1) * per]) for r in range(world)]
        assert np.array_equal(combine(partials), whole), world
    # A left fold (what a rank-order reduction does) is a different number: order matters.
    fold = grads[0]
    for g in grads[1:]:
        fold = fold + g
    assert not np.array_equal(fold, whole)


def test_rank_order_switch_makes_the_sum_depend_on_the_split(rank_order_sums: Callable[[], None]) -> None:
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8) for _ in range(8)]
    rank_order_sums()
    one_rank = tree_sum(grads)
    four_ranks = combine([tree_sum(grads[r * 2 : r * 2 + 2]) for r in range(4)])
    assert not np.array_equal(one_rank, four_ranks)


def test_tree_sum_refuses_a_count_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        tree_sum([np.ones(2)] * 3)


# -- the blocked layout (format v2) ----------------------------------------------------------------
def test_blocks_tile_every_tensor_and_split_without_copying() -> None:
    arrays = {"a": np.arange(20.0).reshape(4, 5), "b": np.zeros(0), "c": np.arange(3.0)}
    parts = parts_of(arrays, block_bytes=64)  # 8 float64 per block
    blocks = plan_blocks(parts)
    assert [b.name for b in blocks] == ["a#00000", "a#00001", "a#00002", "b#00000", "c#00000"]
    assert [b.size for b in blocks] == [8, 8, 4, 0, 3]
    views = split_blocks(arrays, parts)
    assert np.shares_memory(views["a#00001"], arrays["a"])
    assert np.array_equal(np.concatenate([views[f"a#{i:05d}"] for i in range(3)]), arrays["a"].reshape(-1))


def _blocked_checkpoint(tmp_path: Path) -> tuple[LocalStore, CheckpointRef, TrainingSession]:
    store = LocalStore(tmp_path / "store")
    session = TrainingSession.fresh("blocked", store, dist_config())
    session.run(6, checkpoint_every=6)
    ref = latest_committed(store, "blocked")
    assert ref is not None and ref.step == 6
    return store, ref, session


def _rewrite_manifest(store: LocalStore, ref: CheckpointRef, edit: object) -> None:
    key = manifest_key(ref.run_id, ref.kind, ref.step)
    body = json.loads(store.read(key))
    edit(body)  # type: ignore[operator]
    path = store.root / key
    path.chmod(0o644)
    path.write_text(json.dumps(body))


def test_a_distributed_config_saves_format_v2_that_loads_back_exactly(tmp_path: Path) -> None:
    store, ref, session = _blocked_checkpoint(tmp_path)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    assert manifest.format_version == 2 and manifest.parts is not None
    assert manifest.parts["theta/W1"].shape == [8, 16] and manifest.parts["theta/W1"].block_elems == 8
    assert block_name("theta/W1", 15) in {t.name for t in manifest.tensors}  # 128 values = 16 blocks
    state, _ = load_training(store, ref)
    assert compare_states(state, session.state) == []


@pytest.mark.parametrize(
    ("edit", "error", "field"),
    [
        (lambda b: b.update(total_bytes=b["total_bytes"] - b["tensors"].pop(3)["length"]), TensorSpecError, "tensors"),
        (lambda b: b["parts"]["theta/W1"].update(shape=[16, 8]), IntegrityError, "fingerprint"),  # same tiling
        (lambda b: b["parts"]["theta/W1"].update(shape=[8, 17]), TensorSpecError, None),  # blocks do not tile
        (lambda b: b.pop("parts"), ManifestError, None),  # v2 without parts
        (lambda b: b.update(format_version=3), FormatVersionError, "format_version"),
    ],
)
def test_a_tampered_blocked_manifest_is_refused_before_any_tensor_is_read(
    tmp_path: Path, edit: object, error: type[Exception], field: str | None
) -> None:
    store, ref, session = _blocked_checkpoint(tmp_path)
    _rewrite_manifest(store, ref, edit)
    with pytest.raises(error) as caught:
        load_training(store, ref)
    if field is not None:
        assert getattr(caught.value, "field", None) == field


def test_a_blocked_checkpoint_with_a_stray_entry_is_refused(tmp_path: Path) -> None:
    store, ref, _ = _blocked_checkpoint(tmp_path)
    manifest = read_manifest(store, ref, expect_kind=None)
    stray = manifest.tensors[0].model_copy(update={"name": "ghost#00000"})
    forged = manifest.model_copy(update={"tensors": [*manifest.tensors, stray]})
    with pytest.raises(TensorSpecError, match="outside every declared tensor"):
        check_parts(forged)


# -- ownership ------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_slices_are_contiguous_block_aligned_and_cover_the_parameters(world: int) -> None:
    layout = flat_layout({"W1": (8, 16), "b1": (16,), "W2": (16, 3), "b2": (3,)}, block_elems=8)
    slices = layout.slices(world)
    assert slices[0].start == 0 and slices[-1].stop == layout.size
    for before, after in zip(slices, slices[1:], strict=False):
        assert before.stop == after.start
    for s in slices:
        assert sum(b.size for b in s.blocks) == s.size
        if s.blocks:
            assert layout.flat_start(s.blocks[0]) == s.start
    assert sorted(b.name for s in slices for b in s.blocks) == sorted(b.name for b in layout.blocks)


# -- the ZeRO-1 engine at W=1 is the single-process trainer ----------------------------------------
def test_zero_engine_at_world_size_one_equals_the_single_process_trainer(tmp_path: Path) -> None:
    config = dist_config()
    plain = TrainingSession.fresh("r", LocalStore(tmp_path / "plain"), config)
    plain.run(12, checkpoint_every=4)
    job = GangJob(run_id="r", store=str(tmp_path / "zero"), config=config, target_step=8, checkpoint_every=4)
    first = run_rank(SoloComm(), job, tmp_path / "w")
    second = run_rank(SoloComm(), job.model_copy(update={"target_step": 12}), tmp_path / "w")
    assert first.step == 8 and second.resumed_from_step == 8 and second.step == 12
    assert plain.last_commit is not None and second.fingerprint == plain.last_commit.manifest.fingerprint
    assert second.loss == plain.state.history["loss"][-1]


def test_one_microbatch_is_the_v1_arithmetic(tmp_path: Path) -> None:
    plain = TrainingSession.fresh("r", LocalStore(tmp_path / "a"), small_config(batch_size=16))
    split = TrainingSession.fresh("r", LocalStore(tmp_path / "b"), dist_config(microbatches=1))
    plain.run(10)
    split.run(10)
    for name, arr in plain.state.tensors.items():
        assert np.array_equal(arr, split.state.tensors[name]), name


def test_microbatches_change_the_bits_so_they_are_part_of_the_run_identity(tmp_path: Path) -> None:
    a = TrainingSession.fresh("r", LocalStore(tmp_path / "a"), dist_config(microbatches=1))
    b = TrainingSession.fresh("r", LocalStore(tmp_path / "b"), dist_config(microbatches=8))
    a.run(10)
    b.run(10)
    assert not np.array_equal(a.state.tensors["theta/W1"], b.state.tensors["theta/W1"])
    assert a.state.history["loss"][0] == pytest.approx(b.state.history["loss"][0], rel=1e-12)


# -- validation of configs and run inputs ---------------------------------------------------------
@pytest.mark.parametrize(
    ("distributed", "batch", "message"),
    [
        ({"microbatches": 6}, 12, "power of two"),
        ({"microbatches": 8}, 12, "must divide batch_size"),
        ({"microbatches": 2, "block_bytes": 100}, 4, "multiple of 8"),
    ],
)
def test_bad_distributed_configs_fail_fast_naming_the_field(distributed: dict, batch: int, message: str) -> None:
    from cairn.config import parse_config

    body = small_config().model_dump(mode="json")
    body.update(batch_size=batch, distributed=distributed)
    with pytest.raises(ConfigError, match=message):
        parse_config(body)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"world_size": 3},
            r"world_size must divide config.distributed.microbatches \(8\) \(expected one of \[1, 2, 4, 8\], found 3\)",
        ),
        ({"world_size": 2, "config": small_config().model_dump(mode="json")}, "needs config.distributed"),
        ({"world_size": 4, "nodes": ["a", "b", "c"]}, "multiple of len"),
        ({"world_size": 4, "nodes": ["a", "a"]}, "distinct"),
        ({"world_size": 2, "nodes": ["bad name"]}, "pattern"),
        ({"world_size": 2, "nodes": [""]}, "pattern"),  # `--nodes ""` / `--nodes a,,b`: refused, not dropped
        (
            {"world_size": 2, "min_world_size": 4},
            r"reachable by halving world_size \(expected one of \[2, 1\], found 4\)",
        ),
        ({"world_size": 4, "min_world_size": 3}, r"expected one of \[4, 2, 1\], found 3"),  # 4 -> 2 skips 3
    ],
)
def test_bad_gang_inputs_are_refused_before_anything_runs(overrides: dict, message: str) -> None:
    body = {
        "run_id": "r1",
        "config": dist_config().model_dump(mode="json"),
        "total_steps": 10,
        "store": "/tmp/cairn-never-used",
    }
    body.update(overrides)
    with pytest.raises(ValueError, match=message):
        TrainingRunInput.model_validate(body)


def test_typed_errors_travel_between_processes_by_name() -> None:
    err = error_named("IntegrityError", "rank 1: bad bytes")
    assert isinstance(err, IntegrityError) and not err.retryable and "bad bytes" in str(err)
    other = error_named("NoSuchError", "boom")
    assert isinstance(other, GangFailedError) and other.retryable


# -- the gang's process hygiene -------------------------------------------------------------------
def test_gang_command_is_torchrun_without_restarts(tmp_path: Path) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    one = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "one").command()
    assert one[1:3] == ["-m", "cairn.gang.agent"] and "--standalone" in one and "--max-restarts=0" in one
    spec = GangSpec(
        nproc_per_node=2, nnodes=2, rendezvous="127.0.0.1:29500", rdzv_id="x", is_host=False, local_addr="10.0.0.7"
    )
    two = Gang(spec, job, tmp_path / "two").command()
    assert "--rdzv-backend=c10d" in two and "--rdzv-endpoint=127.0.0.1:29500" in two
    assert "--rdzv-conf=is_host=false,join_timeout=60" in two and "--local-addr=10.0.0.7" in two
    assert two[-4:-2] == ["--job", str(tmp_path / "two" / "job.json")]


def test_reap_kills_every_process_carrying_the_gang_token() -> None:
    token = f"cairn-gang-{uuid.uuid4().hex[:16]}"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token], start_new_session=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 10
        while len(gang_processes(token)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sorted(reap(token)) == sorted(p.pid for p in procs)
        for p in procs:
            assert p.wait(timeout=10) == -signal.SIGKILL
        assert gang_processes(token) == []
    finally:
        for p in procs:
            p.kill()


def test_the_distributed_examples_validate_and_name_a_world_size_that_divides_the_microbatches() -> None:
    from cairn.config import load_config
    from tests.conftest import REPO
    from workers.run_input import load_run_input

    config = load_config(REPO / "examples" / "distributed.json")
    assert config.distributed is not None and config.distributed.microbatches == 8
    inp = load_run_input(str(REPO / "examples" / "distributed-run.json"))
    assert inp.gang and inp.world_size == 4 and inp.config == config
    resumed = load_run_input(str(REPO / "examples" / "distributed-run.json"), overrides={"world_size": 2})
    assert resumed.world_size == 2
    with pytest.raises(ConfigError, match="world_size must divide"):
        load_run_input(str(REPO / "examples" / "distributed-run.json"), overrides={"world_size": 3})


@pytest.mark.parametrize("rank_order", [False, True])
def test_the_in_place_tree_over_rows_is_bit_equal_to_tree_sum(
    rank_order: bool, rank_order_sums: Callable[[], None]
) -> None:
    from cairn.distributed.reduce import tree_sum_rows

    if rank_order:
        rank_order_sums()
    rng = np.random.default_rng(2)
    for world in (1, 2, 4, 8):
        rows = rng.standard_normal((world, 257)) * 10.0 ** rng.integers(-8, 8, size=(world, 1))
        expected = tree_sum(list(rows))
        assert tree_sum_rows(rows.copy()).tobytes() == expected.tobytes()
