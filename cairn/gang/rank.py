"""A rank process, as ``torchrun`` starts it: ``python -m cairn.gang.rank --job JOB.json``.

It joins the process group, restores the run's last committed checkpoint onto this world size
(or starts fresh), trains to the job's target with coordinated checkpoints, and exits. Files in
the job's directory are its only channel to the supervisor: ``progress.json``, ``result.json``,
``error-rank{R}.json``, and ``stop`` (checkpoint and exit, agreed by all ranks). It dies with
its parent (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cairn.checkpoint.compression import last_choice
from cairn.checkpoint.latest import latest_committed
from cairn.checkpoint.options import CheckpointOptions, checkpoint_overrides
from cairn.checkpoint.ref import CheckpointRef
from cairn.config import TrainConfig
from cairn.distributed.checkpoint import agree, failure_of
from cairn.distributed.comm import Comm, init_torch_comm
from cairn.distributed.reduce import reduction_order, summing_in
from cairn.errors import CairnError, ConfigError
from cairn.gang.job import GangJob, RankResult
from cairn.runs.restore import require_not_past
from cairn.session import with_process_numerics
from cairn.stores import open_store
from cairn.trainers.base import DataParallelEngine
from cairn.trainers.loading import load_trainer, require_trusted

__all__ = [
    "main",
    "run_rank",
    "die_with_parent",
    "gang_device",
    "write_json_atomic",
    "alive_path",
    "ended_path",
    "signs_of_life",
    "ENDED_GLOB",
]

PROGRESS_EVERY = 0.1
"""Seconds between progress-file writes of a rank (its supervisor polls at this pace)."""
ALIVE_EVERY = 0.25
"""Seconds between a rank's signs of life (``alive-rank{R}``'s modification time): from a thread
of its own, so a rank busy in a long step or blocked in a collective still shows them, and a
frozen one (SIGSTOP, a stopped VM) does not."""


ENDED_GLOB = "ended-rank*"
"""The files of ranks that have ended (``alive-rank{R}`` renamed ``ended-rank{R}``)."""


def alive_path(workdir: Path, rank: int) -> Path:
    """The file whose modification time is rank ``rank``'s last sign of life."""
    return workdir / f"alive-rank{rank}"


def ended_path(workdir: Path, rank: int) -> Path:
    """``alive_path`` once the rank has ended: its silence is no hang."""
    return workdir / f"ended-rank{rank}"


def signs_of_life(workdir: Path, rank: int, every: float = ALIVE_EVERY) -> Callable[[], None]:
    """Touch ``alive_path(workdir, rank)`` every ``every`` seconds from a daemon thread. Returns
    the function to call when the rank ends: it stops the thread and renames the file
    ``ended-rank{R}``, so a rank that has finished (or failed, and said why) is not taken for a
    silent one while its peers and torchrun wind down."""
    path, done = alive_path(workdir, rank), threading.Event()

    def beat() -> None:
        while True:
            try:
                path.touch()
            except OSError:  # the job folder is gone: the supervisor is done with this gang
                return
            if done.wait(every):
                return

    thread = threading.Thread(target=beat, name="cairn-rank-alive", daemon=True)
    thread.start()

    def ended() -> None:
        done.set()
        thread.join()
        with contextlib.suppress(OSError):
            os.replace(path, ended_path(workdir, rank))

    return ended


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere); exit at once if
    the parent died before the request was armed (this process was re-parented)."""
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if parent == 1 or os.getppid() != parent:
            os._exit(1)


def write_json_atomic(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def stamp_numerics(comm: Comm, engine: DataParallelEngine, where: str, tolerate: bool) -> None:
    """Record this rank's numerics profile in the engine's state, or refuse (on every rank alike)
    a bit-exact state computed under another profile."""
    failure = None
    try:
        assert engine.state is not None
        engine.state.lineage = with_process_numerics(engine.state, engine.trainer, where, tolerate)
    except Exception as exc:
        failure = failure_of(exc)
    agree(comm, failure, "numerics")


def gang_device(config: TrainConfig, local_rank: int) -> str | None:
    """The GPU this rank trains on (``cuda:LOCAL_RANK``: one rank per GPU) when the run's trainer
    options say ``device: cuda``, else None (gloo on the CPU). Read from the options as plain
    JSON: nothing is imported for it."""
    options = config.trainer.options if config.trainer is not None else {}
    device = options.get("device", "cpu")
    if device == "cpu":
        return None
    if device != "cuda":
        raise ConfigError(
            "trainer.options.device",
            expected="cpu or cuda in a gang (each rank takes its LOCAL_RANK's GPU)",
            found=device,
        )
    return f"cuda:{local_rank}"


def run_rank(comm: Comm, job: GangJob, workdir: Path, local_rank: int = 0) -> RankResult:
    """Train one rank's share of a segment; returns the segment's outcome (the same on every rank)."""
    with summing_in(job.reduction):
        return _train(comm, job, workdir, local_rank)


def _train(comm: Comm, job: GangJob, workdir: Path, local_rank: int) -> RankResult:
    options = CheckpointOptions.from_env(**checkpoint_overrides(job.incremental, job.compression))
    config = job.config
    store = open_store(job.store)
    target, every = job.target_step, job.checkpoint_every
    engine: DataParallelEngine | None = None
    failure = None
    try:
        if job.config_from_checkpoint:  # an untrusted checkpoint's config: the one trust rule
            require_trusted(config, None)
        engine = load_trainer(config).data_parallel(comm, job.run_id, store, options)
    except Exception as exc:
        failure = failure_of(exc)
    agree(comm, failure, "start")
    assert engine is not None
    chosen: str | None = None
    if comm.rank == 0:
        latest = job.resume_from or latest_committed(store, job.run_id, options=options)
        chosen = None if latest is None else str(latest)
    ref = comm.broadcast_json(chosen if comm.rank == 0 else None)  # one choice for every rank
    last: dict[str, Any]
    if ref is None:
        engine.start_fresh()
        stamp_numerics(comm, engine, "the fresh state", job.tolerate_numerics)
        saved = engine.save()  # step 0 is a checkpoint too: the origin is durable
        last = {"checkpoint": saved.ref, "fingerprint": saved.fingerprint}
    else:
        manifest = engine.load(CheckpointRef.parse(ref))
        stamp_numerics(comm, engine, ref, job.tolerate_numerics)
        last = {"checkpoint": ref, "fingerprint": manifest.fingerprint}
    state = engine.state
    assert state is not None
    resumed = state.step
    require_not_past(resumed, target)
    workdir.mkdir(parents=True, exist_ok=True)
    progress = workdir / "progress.json"
    stop_file = workdir / "stop"
    throttle = job.throttle_seconds_per_step

    written = 0.0

    def report(**extra: Any) -> None:
        """The node's progress file, for its supervisor's heartbeats: at every commit, and at
        most every ``PROGRESS_EVERY`` seconds between (not a file write per step)."""
        nonlocal written
        now = time.monotonic()
        if local_rank == 0 and (extra or now - written >= PROGRESS_EVERY):
            written = now
            write_json_atomic(
                progress,
                {
                    "step": state.step,
                    "loss": state.last("loss"),
                    **last,
                    **extra,
                },
            )

    report(committed_step=resumed)
    interrupted = False
    while state.step < target:
        engine.step()
        if throttle:
            time.sleep(throttle)
        stop = comm.any(stop_file.exists())
        if state.step % every == 0 or state.step == target or stop:
            saved = engine.save()
            last = {"checkpoint": saved.ref, "fingerprint": saved.fingerprint}
            report(committed_step=state.step)
        else:
            report()
        if stop:
            interrupted = True
            break
    return RankResult.of(
        state,
        checkpoint=last["checkpoint"],
        fingerprint=last["fingerprint"],
        resumed_from_step=resumed,
        interrupted=interrupted,
        world_size=comm.world,
        reduction=reduction_order(),
        compression=last_choice(store.url),
    )


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()
    # Stopping is the supervisor's stop file, agreed by all ranks; a terminal's Ctrl-C (or a
    # signal to a process group) must not kill a rank halfway through a step or a save.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="cairn.gang.rank")
    parser.add_argument("--job", required=True)
    parser.add_argument("--gang", required=True, help="the gang's token (the supervisor reaps by it)")
    args = parser.parse_args(argv)
    job_path = Path(args.job)
    workdir = job_path.parent
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ended = signs_of_life(workdir, rank)
    try:
        job = GangJob.read(job_path, "gang job")
        comm = init_torch_comm(job.collective_timeout_seconds, gang_device(job.config, local_rank))
        result = run_rank(comm, job, workdir, local_rank)
        if local_rank == 0:
            write_json_atomic(workdir / "result.json", result.model_dump(mode="json"))
        import torch.distributed as dist  # torch only here: the process group init_torch_comm made

        dist.destroy_process_group()
        return 0
    except CairnError as exc:
        write_json_atomic(
            workdir / f"error-rank{rank}.json", {"type": exc.type_name, "message": str(exc), "rank": rank}
        )
        print(f"rank {rank}: {exc.type_name}: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # a peer died (gloo), or a bug: the gang fails and is retried
        write_json_atomic(
            workdir / f"error-rank{rank}.json",
            {"type": "GangFailedError", "message": f"{type(exc).__name__}: {exc}", "rank": rank},
        )
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        ended()


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the process group is already destroyed: skip torch's slow interpreter teardown
