# ruff: noqa: E501  (sentences read better unbroken)
"""FSDP2 checkpoints and steps (``distributed.strategy: fsdp``) at W = 4, 2, 1 ranks, side by side.

W real rank processes (``torch.multiprocessing``, spawned; gloo over loopback, as
``cairn.distributed.comm.init_torch_comm`` joins it) each build ``WideMLP`` (below: square
``Linear`` layers, each its own ``fully_shard`` unit, AdamW, random data) from its config and
take the PyTorch adapter's own FSDP engine (``trainer.data_parallel``: ``TorchFSDP``), one update
done so that both Adam moments exist. One gang per W (the largest first); within it every case
is interleaved rep by rep, each timed between two barriers, and each rank also clocks its own
call (``own``: from the release to its return):

- **saves**: ``cairn`` = ``engine.save()`` (each rank writes the blocks whose first element it
  holds, completed by its neighbours' elements: no gather; BLAKE3, fsync; rank 0 commits), into
  fresh files; ``floor`` = rank 0 writes the whole state's bytes as one file + fsync (the disk's
  sustained write bandwidth, measured in the same gang, as ``bench.suites.store`` measures its
  floor); ``floor_parallel`` = every rank writes its shard's bytes to its own file + fsync.
  The floor for a rank's shard is its shard's bytes / that bandwidth.
- **restores** (every file's pages evicted first): ``cairn`` = ``engine.load(ref)`` of this
  gang's checkpoint (manifest, checks, only the blocks overlapping the rank's shard, checksums,
  values, installed in the live DTensors); the floors read the same files back. At W = 2 also,
  **resharding from W = 4**: ``cairn_w4`` = ``engine.load`` of the W = 4 gang's checkpoint, and
  ``dcp_w4`` = PyTorch DCP's own: ``get_state_dict`` of the live model and optimizer,
  ``dcp.load`` (its default ``FileSystemReader``) of the same state that the W = 4 gang saved
  with ``dcp.save`` from its live FSDP model and optimizer, ``set_state_dict``. Both are checked
  to give the same bits on every rank.
- **peak RSS** per rank (``measure.peak_rss``, sampled every 2 ms) of one more save and one
  more restore, above the rank's RSS at the call's start.
- **steps**: one update of the FSDP engine vs one of the replicated engine (``TorchDP``: the
  whole state on every rank, gradients reduced by Cairn's canonical tree) of the same model.

This module is the driver and the ranks' code; rendered by ``bench.sections.fsdp``.

Run: ``python -m bench.suites.fsdp [--mib 160] [--reps 5] [--step-reps 3] [--worlds 4,2,1] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.harness.floor import floor_read_file, floor_write_file
from bench.harness.machine import machine
from bench.harness.measure import MiB, drop_cache, interleaved, peak_rss, stats
from bench.harness.ranks import BLOCK_BYTES, MICROBATCHES, cpu_of_gang, progress, timed_cases
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer

LAYERS = 4
BATCH = 64
RESHARD = (4, 2)
"""The resharding case: the W = 4 gang's checkpoints restored by the W = 2 gang."""
STEP_CASES = ("fsdp", "replicated")


class WideOptions(TorchOptions):
    width: int = 256
    layers: int = LAYERS
    examples: int = 4 * BATCH


class WideMLP(TorchTrainer):
    """``layers`` square ``Linear(width, width)`` layers with ReLUs between, AdamW, random
    examples of ``width`` classes: about ``12 * layers * width**2`` bytes of float32 state."""

    Options = WideOptions
    options: WideOptions

    def build(self) -> TorchSetup:
        w = self.options.width
        layers: list[nn.Module] = []
        for i in range(self.options.layers):
            layers += [nn.Linear(w, w)] + ([nn.ReLU()] if i + 1 < self.options.layers else [])
        model = nn.Sequential(*layers)
        x = torch.randn(self.options.examples, w)
        y = torch.randint(0, w, (self.options.examples,))
        return TorchSetup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), train=(x, y))

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if isinstance(m, nn.Linear)]


def bench_config(mib: int, strategy: str) -> dict[str, Any]:
    """``WideMLP`` whose parameters and both Adam moments (float32) total about ``mib`` MiB."""
    width = int(math.sqrt(mib * MiB / 12 / LAYERS))
    return {
        "seed": 0,
        "batch_size": BATCH,
        "trainer": {"factory": f"{__name__}:WideMLP", "options": {"width": width}},
        "distributed": {"microbatches": MICROBATCHES, "block_bytes": BLOCK_BYTES, "strategy": strategy},
    }


# -- the ranks --------------------------------------------------------------------------------


def clocked(own: dict[str, list[float]], name: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn``, its wall time on this rank (without the closing barrier) appended to ``own[name]``."""

    def run() -> None:
        start = time.perf_counter()
        fn()
        own.setdefault(name, []).append(time.perf_counter() - start)

    return run


def per_rank(comm: Any, own: dict[str, list[float]]) -> dict[str, list[dict[str, float]]]:
    """Each case's median (min, max) of every rank's own clock, by rank."""
    mine = {n: {k: v for k, v in stats(s).items() if k != "samples"} for n, s in own.items()}
    ranks = comm.all_gather_json(mine)
    return {n: [r[n] for r in ranks] for n in own}


def live_shards(trainer: Any) -> dict[str, torch.Tensor]:
    """This rank's live shards of every parameter and optimizer state."""
    out: dict[str, torch.Tensor] = {}
    for name, p in trainer.params.items():
        out[name] = p.to_local().detach()
        for key, v in trainer.optimizer.state.get(p, {}).items():
            if hasattr(v, "to_local"):
                out[f"{name}/{key}"] = v.to_local()
    return out


def restored_by(trainer: Any, restore: Callable[[], object]) -> dict[str, bytes]:
    """The bytes of this rank's shards after ``restore``, every live shard zeroed before it."""
    with torch.no_grad():
        for t in live_shards(trainer).values():
            t.zero_()
    restore()
    out = {k: t.numpy().tobytes() for k, t in live_shards(trainer).items()}
    assert any(b.strip(b"\0") for b in out.values()), "a restore left the state zeroed"
    return out


def bench_world(comm: Any, job: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from cairn.checkpoint.layout import run_prefix
    from cairn.checkpoint.ref import CheckpointRef
    from cairn.config import parse_config
    from cairn.stores import LocalStore
    from cairn.trainers.loading import load_trainer

    rank, world, reps = comm.rank, comm.world, job["reps"]
    shared, work = Path(job["shared"]), Path(job["workdir"])
    store = LocalStore(shared / "cairn")
    run = f"fsdp-w{world}"
    trainer: Any = load_trainer(parse_config(bench_config(job["mib"], "fsdp")))
    engine = trainer.data_parallel(comm, run, store, UNSIGNED)
    engine.start_fresh()
    engine.step()  # both Adam moments exist, as after training
    shard = sum(a.nbytes for a in engine.state.tensors.values())
    written = sum(b.nbytes for b in engine.my_blocks().values())
    shards = [int(b) for b in comm.all_gather_float(float(shard))]
    total = sum(shards) if world > 1 else shard
    floor_file, parallel_file = work / "floor.bin", work / f"parallel-{rank}.bin"
    mine = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in engine.state.tensors.values()]
    filler = [np.random.default_rng(rank).random((total - shard) // 8 + 1)] if rank == 0 else []
    progress(comm, f"state ready: {total / MiB:.0f} MiB, this rank's shard {shard / MiB:.1f} MiB; saves")

    fresh: dict[str, Callable[[], None]] = {  # what each save case removes first: it writes new files
        "cairn": lambda: store.delete([o.key for o in store.list(run_prefix(run))] if rank == 0 else []),
        "floor": lambda: floor_file.unlink(missing_ok=True),
        "floor_parallel": lambda: parallel_file.unlink(missing_ok=True),
    }

    def before_save(name: str) -> None:  # untimed: the case's old files gone, written back, all ranks ready
        fresh[name]()
        gc.collect()
        comm.barrier()
        os.sync() if rank == 0 else None
        comm.barrier()

    refs: list[str] = []  # of every Cairn save, the last one's restored below
    own_save: dict[str, list[float]] = {}
    cpu_save: dict[str, list[float]] = {}
    save_cases: dict[str, Callable[[], object]] = {
        "cairn": lambda: refs.append(engine.save().ref),
        "floor": lambda: floor_write_file(mine + filler, floor_file) if rank == 0 else None,
        "floor_parallel": lambda: floor_write_file(mine, parallel_file),
    }
    saves = interleaved(
        timed_cases(comm, {n: clocked(own_save, n, f) for n, f in save_cases.items()}, cpu_save),
        reps,
        before=before_save,
    )

    def before_restore(_name: str) -> None:  # untimed: every restore reads from the device
        gc.collect()
        comm.barrier()
        if rank == 0:
            drop_cache(shared)
            drop_cache(work)
        comm.barrier()

    progress(comm, "peak RSS of a save and a restore")
    before_save("cairn")
    with peak_rss() as rss_save:
        save_cases["cairn"]()
    comm.barrier()
    ref = CheckpointRef.parse(refs[-1])
    before_restore("cairn")
    with peak_rss() as rss_restore:
        engine.load(ref)
    comm.barrier()
    rss = comm.all_gather_json({"save": rss_save, "restore": rss_restore})

    dcp_dir = shared / f"dcp-w{world}"
    if world == RESHARD[0]:  # the same state as PyTorch DCP saves it, for the W = 2 gang
        progress(comm, "dcp.save of the same state for the resharding case")
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=dcp_dir)
        del model_sd, optim_sd

    def dcp_restore(source: Path) -> None:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=source)
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)

    restore_cases: dict[str, Callable[[], object]] = {
        "cairn": lambda: engine.load(ref),
        "floor": lambda: floor_read_file(floor_file, total) if rank == 0 else None,
        "floor_parallel": lambda: floor_read_file(parallel_file, shard),
    }
    source = job.get("reshard_from")
    if source is not None:
        ref_w4, dcp_w4 = CheckpointRef.parse(source["ref"]), Path(source["dcp"])
        restore_cases["cairn_w4"] = lambda: engine.load(ref_w4)
        restore_cases["dcp_w4"] = lambda: dcp_restore(dcp_w4)
    progress(comm, "restores")
    own_restore: dict[str, list[float]] = {}
    cpu_restore: dict[str, list[float]] = {}
    restores = interleaved(
        timed_cases(comm, {n: clocked(own_restore, n, f) for n, f in restore_cases.items()}, cpu_restore),
        reps,
        before=before_restore,
    )
    if source is not None:  # the two resharded restores hold the same bits on every rank
        ours, theirs = restored_by(trainer, restore_cases["cairn_w4"]), restored_by(trainer, restore_cases["dcp_w4"])
        assert ours == theirs, f"rank {rank}: the resharded restores of Cairn and DCP differ"

    progress(comm, "steps: fsdp vs replicated")
    replicated: Any = load_trainer(parse_config(bench_config(job["mib"], "replicated")))
    rep_engine = replicated.data_parallel(comm, f"{run}-replicated", store, UNSIGNED)
    rep_engine.start_fresh()
    rep_engine.step()  # warm: the optimizer's state exists, as in the FSDP engine
    steps = interleaved(
        timed_cases(comm, {"fsdp": engine.step, "replicated": rep_engine.step}),
        job["step_reps"],
        before=lambda _n: comm.barrier(),
    )

    return {
        "world": world,
        "bytes": total,
        "shard_bytes": shards,
        "written_bytes": [int(b) for b in comm.all_gather_float(float(written))],
        "tensors": len(engine.state.tensors),
        "ref": refs[-1],
        "save": {n: stats(saves[n]) for n in save_cases},
        "restore": {n: stats(restores[n]) for n in restore_cases},
        "save_per_rank": per_rank(comm, own_save),
        "restore_per_rank": per_rank(comm, own_restore),
        "cpu_seconds": {"save": cpu_of_gang(comm, cpu_save), "restore": cpu_of_gang(comm, cpu_restore)},
        "rss": rss,
        "steps": {n: stats(steps[n]) for n in STEP_CASES},
        "loadavg_after": os.getloadavg(),
    }


def rank_main(rank: int, world: int, port: int, job: dict[str, Any], result_path: str) -> None:
    """One rank: join the gloo group, run every case, rank 0 writes the gang's results."""
    import torch.distributed as dist

    from cairn.distributed.comm import init_torch_comm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    comm = init_torch_comm(timeout_seconds=600.0)
    progress(comm, "joined")
    result = bench_world(comm, job)
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, default=float))
    dist.destroy_process_group()


# -- the driver -------------------------------------------------------------------------------


def run_gang(world: int, job: dict[str, Any], result: Path) -> dict[str, Any]:
    """The results of a gang of ``world`` spawned ranks (rank 0 writes them to ``result``)."""
    import torch.multiprocessing as mp

    from cairn.gang import free_port

    mp.spawn(rank_main, args=(world, free_port(), job, str(result)), nprocs=world, join=True)
    return dict(json.loads(result.read_text()))


def report(r: dict[str, Any]) -> None:
    w = r["world"]
    for op in ("save", "restore"):
        x = r[op]
        ours = x["cairn"]["median"]
        print(
            f"W={w} {r['bytes'] / MiB:4.0f} MiB {op:<7} cairn {ours:6.3f}s"
            + "".join(f"  {n} {x[n]['median']:6.3f}s" for n in x if n != "cairn")
            + "  per rank "
            + " ".join(f"{v['median']:.3f}" for v in r[f"{op}_per_rank"]["cairn"]),
            flush=True,
        )
    peaks = " ".join(f"{q['save']['peak_extra'] / MiB:.1f}/{q['restore']['peak_extra'] / MiB:.1f}" for q in r["rss"])
    shards = " ".join(f"{s / MiB:.1f}" for s in r["shard_bytes"])
    print(f"W={w} peak extra RSS save/restore MiB per rank: {peaks} (shards {shards} MiB)", flush=True)
    st = r["steps"]
    print(
        f"W={w} step fsdp {st['fsdp']['median']:.3f}s replicated {st['replicated']['median']:.3f}s "
        f"({st['fsdp']['median'] / st['replicated']['median']:.2f}x)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=160, help="parameters + both Adam moments, float32, MiB")
    parser.add_argument("--reps", type=int, default=5, help="of every save and restore case")
    parser.add_argument("--step-reps", type=int, default=3, help="of every update case (seconds each)")
    parser.add_argument("--worlds", default="4,2,1", help="gangs, run in this order (W=4 before W=2 for resharding)")
    parser.add_argument("--quick", action="store_true", help="24 MiB, 2 reps: a smoke run")
    args = parser.parse_args()
    mib, reps, step_reps = (24, 2, 2) if args.quick else (args.mib, args.reps, args.step_reps)
    worlds = [int(w) for w in args.worlds.split(",")]
    host = machine()
    started = time.monotonic()
    results: dict[str, Any] = {}
    gang_seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-fsdp-") as tmp:
        shared = Path(tmp) / "shared"
        shared.mkdir()
        for world in worlds:
            job: dict[str, Any] = {"mib": mib, "reps": reps, "step_reps": step_reps, "shared": str(shared)}
            if world == RESHARD[1] and str(RESHARD[0]) in results:
                job["reshard_from"] = {
                    "ref": results[str(RESHARD[0])]["ref"],
                    "dcp": str(shared / f"dcp-w{RESHARD[0]}"),
                }
            work = Path(tmp) / f"w{world}"
            work.mkdir()
            t0, load = time.monotonic(), os.getloadavg()
            results[str(world)] = r = run_gang(world, {**job, "workdir": str(work)}, work.with_suffix(".json"))
            gang_seconds[str(world)] = time.monotonic() - t0
            r["loadavg_before"] = load
            shutil.rmtree(work)
            report(r)
            print(f"W={world}: gang done in {gang_seconds[str(world)]:.0f} s, load {os.getloadavg()}", flush=True)
    write_result(
        "fsdp",
        {
            "machine": host,
            "reps": reps,
            "step_reps": step_reps,
            "mib": mib,
            "block_bytes": BLOCK_BYTES,
            "model": {
                **bench_config(mib, "fsdp")["trainer"]["options"],
                "layers": LAYERS,
                "batch": BATCH,
                "microbatches": MICROBATCHES,
            },
            "worlds": results,
            "cores": os.cpu_count(),
            "gang_seconds": gang_seconds,
            "wall_seconds": time.monotonic() - started,
            "loadavg_at_end": os.getloadavg(),
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
