"""The rank side of the distributed benchmark (``bench.suites.distributed``): what every rank process of a gang runs.

``rank_main`` joins the gloo group and runs the checkpoint cases (``bench_checkpoints``: Cairn,
DCP and the two floors, saves then restores) and the reduction cases (``bench_comm``), each
timed on rank 0 between barriers; rank 0 writes the gang's results for the driver to collect.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.floor import floor_read_file, floor_write_file
from bench.harness.measure import MiB, drop_cache, interleaved, stats
from bench.harness.states import UNSIGNED

BLOCK_BYTES = 1 << 20
"""The checkpoint block size (``distributed.block_bytes``: the config's default)."""
FEATURES, CLASSES = 2048, 8
MICROBATCHES = 4
SAVE_CASES = ("cairn", "dcp", "floor", "floor_parallel")
COMM_CASES = ("canonical", "canonical_reused", "all_reduce")
Phases = dict[str, dict[str, list[float]]]


def bench_config(mib: int) -> dict[str, Any]:
    """The built-in MLP whose theta + m + v total about ``mib`` MiB (as ``states.big_state``),
    with a ``distributed`` section."""
    hidden = max(1, int(mib * MiB / 8 / 3 / (FEATURES + CLASSES + 1)))
    return {
        "seed": 0,
        "batch_size": MICROBATCHES,
        "model": {"hidden": hidden},
        "data": {"n_examples": 64, "n_features": FEATURES, "n_classes": CLASSES},
        "distributed": {"microbatches": MICROBATCHES, "block_bytes": BLOCK_BYTES},
    }


def timed_cases(
    comm: Any, cases: dict[str, Callable[[], object]], cpu: dict[str, list[float]] | None = None
) -> dict[str, Callable[[], object]]:
    """Each case followed by a barrier: ``interleaved`` starts its clock after ``before``'s
    barrier, so a time runs from all ranks released to the last rank done. ``cpu`` collects
    this process's CPU seconds (user + system, every thread) of each call, the barrier excluded."""

    def wrap(name: str, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> None:
            start = time.process_time()
            fn()
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - start)
            comm.barrier()

        return run

    return {name: wrap(name, fn) for name, fn in cases.items()}


def cpu_of_gang(comm: Any, cpu: dict[str, list[float]]) -> dict[str, float]:
    """Each case's CPU seconds summed over the ranks (each rank's median call)."""
    return {name: sum(comm.all_gather_float(stats(samples)["median"])) for name, samples in cpu.items()}


def progress(comm: Any, message: str) -> None:
    """A progress line from rank 0 (the gang's stdout is the benchmark's)."""
    if comm.rank == 0:
        print(f"  W={comm.world} {time.strftime('%H:%M:%S')} {message}", flush=True)


def files_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# -- checkpoints ------------------------------------------------------------------------------


def bench_checkpoints(comm: Any, mib: int, reps: int, workdir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    from cairn.checkpoint.blocks import block_name
    from cairn.checkpoint.reader import read_manifest
    from cairn.checkpoint.ref import CheckpointRef
    from cairn.config import parse_config
    from cairn.distributed.checkpoint import read_blocks
    from cairn.stores import LocalStore
    from cairn.trainers.loading import load_trainer
    from cairn.trainers.mlp.zero import ZeroMLP
    from cairn.trainers.validate import check_training_manifest

    rank, world = comm.rank, comm.world
    trainer = load_trainer(parse_config(bench_config(mib)))
    store = LocalStore(workdir / "cairn")
    model = ZeroMLP(trainer, comm, "bench", store, UNSIGNED)
    model.start_fresh()
    rng = np.random.default_rng(1 + rank)
    model.m[:] = rng.standard_normal(model.m.size) * 1e-3
    model.v[:] = np.abs(rng.standard_normal(model.v.size)) * 1e-6
    mine, layout = model.mine, model.layout
    theta = model.theta[mine.start : mine.stop]
    slices = {"theta": theta, "adam.m": model.m, "adam.v": model.v}
    total_bytes = 3 * layout.size * 8
    floor_file, parallel_file = workdir / "floor.bin", workdir / f"parallel-{rank}.bin"
    dcp_dir = workdir / "dcp"
    floor_arrays = [model.theta, rng.standard_normal(2 * layout.size)] if rank == 0 else []

    def sharded(local: torch.Tensor) -> Any:
        meta = ShardMetadata(shard_offsets=[mine.start], shard_sizes=[mine.size], placement=f"rank:{rank}/cpu")
        # a rank whose slice is empty (a tiny model) holds no shard: DCP keys chunks by offset
        return init_from_local_shards([Shard(local, meta)] if mine.size else [], [layout.size])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ShardedTensor is marked deprecated in favour of DTensor
        dcp_state = {k: sharded(torch.from_numpy(a)) for k, a in slices.items()}

    def before_save(name: str) -> None:  # untimed: every save writes new files
        if rank == 0:
            if name == "cairn":
                store.delete([o.key for o in store.list("")])
            elif name == "dcp":
                shutil.rmtree(dcp_dir, ignore_errors=True)
            elif name == "floor":
                floor_file.unlink(missing_ok=True)
        if name == "floor_parallel":
            parallel_file.unlink(missing_ok=True)
        gc.collect()
        comm.barrier()
        if rank == 0:
            os.sync()
        comm.barrier()

    saved: dict[str, Any] = {}

    def cairn_save() -> None:
        saved["outcome"] = model.save()

    def dcp_save() -> None:
        dcp.save(dcp_state, storage_writer=dcp.FileSystemWriter(dcp_dir))

    def floor_save() -> None:
        if rank == 0:
            floor_write_file(floor_arrays, floor_file)

    progress(comm, f"state ready: {total_bytes / MiB:.0f} MiB, {len(layout.blocks)} blocks; saves")
    cpu_save: dict[str, list[float]] = {}
    saves = interleaved(
        timed_cases(
            comm,
            {
                "cairn": cairn_save,
                "dcp": dcp_save,
                "floor": floor_save,
                "floor_parallel": lambda: floor_write_file(list(slices.values()), parallel_file),
            },
            cpu_save,
        ),
        reps,
        before=before_save,
    )
    ref = CheckpointRef.parse(saved["outcome"].ref)

    def cairn_restore() -> dict[str, np.ndarray]:
        manifest = read_manifest(store, ref, expect_kind=None, options=UNSIGNED)
        check_training_manifest(manifest, trainer=trainer)
        out = {group: np.empty(mine.size) for group in slices}
        targets: dict[str, np.ndarray] = {}
        for block in mine.blocks:
            flat = layout.flat_start(block) - mine.start
            param = block.tensor.split("/", 1)[1]
            for group, buf in out.items():
                targets[block_name(f"{group}/{param}", block.index)] = buf[flat : flat + block.size]
        read_blocks(comm, store, ref, manifest, targets, value_check=trainer.check_values, options=UNSIGNED)
        return out

    def dcp_restore() -> dict[str, np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target = {k: sharded(torch.empty(mine.size, dtype=torch.float64)) for k in slices}
            dcp.load(target, storage_reader=dcp.FileSystemReader(dcp_dir))
        return {k: local_values(t) for k, t in target.items()}

    def local_values(t: Any) -> np.ndarray:
        shards = t.local_shards()
        return shards[0].tensor.numpy() if shards else np.empty(0)

    def before_restore(_name: str) -> None:  # untimed: every restore reads from the device
        gc.collect()
        comm.barrier()
        if rank == 0:
            drop_cache(workdir)
        comm.barrier()

    progress(comm, "restores")
    cpu_restore: dict[str, list[float]] = {}
    restores = interleaved(
        timed_cases(
            comm,
            {
                "cairn": cairn_restore,
                "dcp": dcp_restore,
                "floor": lambda: floor_read_file(floor_file, total_bytes) if rank == 0 else None,
                "floor_parallel": lambda: floor_read_file(parallel_file, 3 * mine.size * 8),
            },
            cpu_restore,
        ),
        reps,
        before=before_restore,
    )
    progress(comm, "checking the restored slices")
    for name, got in (("cairn", cairn_restore()), ("dcp", dcp_restore())):  # bit-exact, every rank
        for group, want in slices.items():
            assert got[group].tobytes() == want.tobytes(), f"{name} restored {group} wrong on rank {rank}"
    ours_bytes = comm.all_gather_float(float(3 * mine.size * 8))
    on_disk = {
        "cairn": files_bytes(workdir / "cairn"),
        "dcp": files_bytes(dcp_dir),
        "floor": files_bytes(floor_file),
        "floor_parallel": sum(files_bytes(workdir / f"parallel-{r}.bin") for r in range(world)),
    }
    return {
        "world": world,
        "bytes": total_bytes,
        "bytes_per_rank": [int(b) for b in ours_bytes],
        "elements": layout.size,
        "blocks": len(layout.blocks),
        "blocks_per_rank": [len(s.blocks) for s in model.slices],
        "cairn_files": sum(1 for p in (workdir / "cairn").rglob("*") if p.is_file()),
        "bytes_on_disk": on_disk,
        "save": {name: stats(saves[name]) for name in SAVE_CASES},
        "restore": {name: stats(restores[name]) for name in SAVE_CASES},
        "cpu_seconds": {"save": cpu_of_gang(comm, cpu_save), "restore": cpu_of_gang(comm, cpu_restore)},
    }


# -- communication ----------------------------------------------------------------------------


def tree_into(pieces: list[np.ndarray], scratch: list[np.ndarray]) -> np.ndarray:
    """``cairn.distributed.reduce.tree_sum`` (the same pairs, the same order, the same bits)
    into preallocated buffers: ``len(pieces) - 1`` of them, the last one receives the sum."""
    level, used = pieces, 0
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2], strict=True):
            nxt.append(np.add(a, b, out=scratch[used]))
            used += 1
        level = nxt
    return level[0]


def reduction_cases(comm: Any, n: int) -> tuple[dict[str, Callable[[], object]], Callable[[str], None], Phases]:
    """The ways to reduce an ``n``-element gradient (the same sum on every rank, within
    rounding): the cases, their untimed ``before``, and rank 0's split of the canonical ones.

    ``canonical`` is ``ZeroMLP.step``'s path (``SliceReducer``: its exchange buffers kept across
    updates, the tree summed in place); ``canonical_reused`` is the same collectives and the same
    arithmetic written directly on ``all_to_all_single`` (what the path costs without Cairn's
    ``Comm`` layer); ``all_reduce`` sums in place."""
    import torch
    import torch.distributed as dist

    from cairn.distributed.partition import flat_layout
    from cairn.distributed.reduce import SliceReducer, tree_sum_rows

    rank, world = comm.rank, comm.world
    slices = flat_layout({"g": (n,)}, BLOCK_BYTES // 8).slices(world)
    k = slices[rank].size
    widths = [s.size for s in slices]
    partial = np.random.default_rng(rank).standard_normal(n)  # this rank's subtree sum
    phases: Phases = {c: {"exchange": [], "combine": [], "all_gather": []} for c in COMM_CASES if c != "all_reduce"}

    def record(case: str, *marks: float) -> None:
        for name, t0, t1 in zip(phases[case], marks, marks[1:], strict=False):
            phases[case][name].append(t1 - t0)

    reducer = SliceReducer(comm, widths)  # what ZeroMLP.step uses: buffers kept across updates
    gathered = np.empty(n)

    def canonical() -> np.ndarray:
        t0 = time.perf_counter()
        rows = reducer.received(partial)
        t1 = time.perf_counter()
        g = tree_sum_rows(rows)
        t2 = time.perf_counter()
        reducer.all_gather(g, out=gathered)
        record("canonical", t0, t1, t2, time.perf_counter())
        return gathered

    received_buf, tiled, full_buf = np.empty(k * world), np.empty(k * world), np.empty(n)
    scratch = [np.empty(k) for _ in range(world - 2)] + [tiled[:k]]
    received_t, tiled_t, full_t, partial_t = (torch.from_numpy(a) for a in (received_buf, tiled, full_buf, partial))

    def canonical_reused() -> np.ndarray:
        t0 = time.perf_counter()
        dist.all_to_all_single(received_t, partial_t, output_split_sizes=[k] * world, input_split_sizes=widths)
        t1 = time.perf_counter()
        tree_into([received_buf[r * k : (r + 1) * k] for r in range(world)], scratch)
        for r in range(1, world):
            tiled[r * k : (r + 1) * k] = tiled[:k]
        t2 = time.perf_counter()
        dist.all_to_all_single(full_t, tiled_t, output_split_sizes=widths, input_split_sizes=[k] * world)
        record("canonical_reused", t0, t1, t2, time.perf_counter())
        return full_buf

    source = torch.from_numpy(partial)
    buffer = torch.empty_like(source)

    def all_reduce() -> np.ndarray:
        dist.all_reduce(buffer)
        return buffer.numpy()

    def before(_name: str) -> None:
        buffer.copy_(source)  # untimed: every all-reduce sums the ranks' original vectors
        comm.barrier()

    return {"canonical": canonical, "canonical_reused": canonical_reused, "all_reduce": all_reduce}, before, phases


def bench_comm(comm: Any, sizes: list[int], reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        progress(comm, f"reduction of {n} elements")
        cases, before, phases = reduction_cases(comm, n)
        reference = np.array(cases["canonical"]())  # warm-up of every case (connections), untimed
        comm.barrier()
        reused = cases["canonical_reused"]()
        comm.barrier()
        assert reused.tobytes() == reference.tobytes(), "the reused-buffer path changed the bits"
        before("")
        summed = cases["all_reduce"]()
        comm.barrier()
        assert np.allclose(reference, summed, rtol=1e-12, atol=1e-12)
        for case in phases.values():
            for p in case.values():
                p.clear()
        times = interleaved(timed_cases(comm, cases), reps, before=before)
        medians = {name: stats(times[name])["median"] for name in COMM_CASES}
        out[str(n)] = {
            "elements": n,
            "bytes": n * 8,
            **{name: stats(times[name]) for name in COMM_CASES},
            "phases_rank0": {c: {name: stats(p) for name, p in split.items()} for c, split in phases.items()},
            "ratio": medians["canonical"] / medians["all_reduce"],
            "ratio_reused": medians["canonical_reused"] / medians["all_reduce"],
        }
    return out


# -- the gang ---------------------------------------------------------------------------------


def rank_main(rank: int, world: int, port: int, job: dict[str, Any], result_path: str) -> None:
    """One rank: join the gloo group, run the checkpoint and communication cases, rank 0 writes
    the gang's results."""
    import json

    import torch
    import torch.distributed as dist

    from cairn.distributed.comm import init_torch_comm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    comm = init_torch_comm(timeout_seconds=600.0)
    workdir = Path(job["workdir"])
    progress(comm, "joined")
    result: dict[str, Any] = {}
    if job["mib"]:
        result["checkpoint"] = bench_checkpoints(comm, job["mib"], job["reps"], workdir)
        comm.barrier()
        if rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        comm.barrier()
    if world > 1 and job["comm_sizes"]:
        result["comm"] = bench_comm(comm, job["comm_sizes"], job["comm_reps"])
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, default=float))
    dist.destroy_process_group()
