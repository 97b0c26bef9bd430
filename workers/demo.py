"""`make demo`: the main job, end to end, on the embedded defaults.

Part 1 — the seed scenario in-process: 17 updates, export, restore in a fresh process, 23
more; bit-identical to 40 uninterrupted (and a weights-only restore is not).
Part 2 — a durable run on Temporal: start the local stack (Temporal dev server with its Web
UI, SeaweedFS), start a TrainingRun, SIGKILL its worker partway, start a new worker, wait for
completion, and compare the final checkpoint bit for bit with an uninterrupted in-process run.
Part 3 — bring your own model: the digits CNN (``examples/digits.py``, PyTorch adapter)
trained on Temporal epoch by epoch (one segment activity per epoch), a worker SIGKILLed in
the second epoch; loss and validation accuracy per epoch, and the bit-exact verdict.
Part 4 — one run over several workers: the MLP data-parallel over torch.distributed (gloo),
4 rank processes on two "nodes" (two workers, each launching its ranks with torchrun), then
the same run continued at 2 ranks; bit-identical to the uninterrupted single-process run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from workers.demo_progress import ProgressDisplay, StepProgress, running_segment
from workers.stack.devstack import StackConfig, default_state_dir, stack_up

if TYPE_CHECKING:
    from workers.stack.servers import ServerProcess

REPO = Path(__file__).resolve().parents[1]
STATE = default_state_dir()


def dev_stack(cfg: StackConfig | None = None) -> dict[str, object]:
    """Bring up the stack the demo runs on and leaves running: ``cairn dev up``'s, its supervised
    worker polling ``cairn-training`` included (the demo's own runs have queues and workers of
    their own). Returns what ``stack_up`` returns."""
    return stack_up(cfg or StackConfig(state_dir=STATE), echo=lambda s: print("   " + s))


def cairn(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--json"], check=True, capture_output=True, text=True, cwd=REPO
    )
    return json.loads(out.stdout)


def compare(a: str, b: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "ckpt", "compare", a, b, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return json.loads(out.stdout)


def demo_worker(name: str, address: str, queue: str, preload: str = "", node: str = "") -> ServerProcess:
    """A worker process on the demo's queue, logging to STATE/logs/demo-NAME.log; ``node``:
    also this host's node queue (a gang's activity for that node lands there)."""
    from workers.stack.servers import ServerProcess

    argv = [sys.executable, "-m", "workers.worker", "--address", address, "--task-queue", queue]
    argv += ["--preload", preload] if preload else []
    argv += ["--node", node, "--advertise-addr", "127.0.0.1"] if node else []
    return ServerProcess(name, argv, STATE / "logs" / f"demo-{name}.log", cwd=REPO).start()


def seed_scenario(store: Path, config: Path) -> bool:
    print("== Part 1: the seed scenario (in-process, fresh processes for restore)")
    print(f"store: {store}")
    base = ("--store", str(store))
    part = cairn("train", "--config", str(config), "--steps", "17", *base, "--run-id", "demo-seed")
    print(f"1. trained 17 updates            -> {part['checkpoint']} (cursor {part['cursor']})")
    resumed = cairn("train", "--resume", str(part["checkpoint"]), "--steps", "23", *base)
    print(f"2. fresh process: restore, +23   -> {resumed['checkpoint']} (cursor {resumed['cursor']})")
    whole = cairn("train", "--config", str(config), "--steps", "40", *base, "--run-id", "demo-reference")
    print(f"3. uninterrupted 40 updates      -> {whole['checkpoint']} (cursor {whole['cursor']})")
    verdict = compare(str(resumed["checkpoint"]), str(whole["checkpoint"]))
    weights = cairn("train", "--resume", str(part["checkpoint"]), "--steps", "23", *base, "--weights-only")
    wverdict = compare(str(weights["checkpoint"]), str(whole["checkpoint"]))
    ok = bool(verdict["identical"]) and resumed["cursor"] == 80 and not wverdict["identical"]
    if verdict["identical"]:
        print(
            "VERDICT: BIT-IDENTICAL — resumed 17+23 == uninterrupted 40 "
            "(theta, m, v, t, RNG, cursor=80, history, config)"
        )
    else:
        print("VERDICT: DIFFERENT —", verdict["differences"])
    fields = ", ".join(str(d["field"]) for d in wverdict["differences"][:5])  # type: ignore[attr-defined]
    print(f"control: a weights-only restore differs from the uninterrupted run ({fields}, ...)\n")
    return ok


async def temporal_drill() -> tuple[bool, str]:
    from datetime import timedelta

    from temporalio.service import RPCError

    from activities.inputs import TrainingRunInput
    from activities.views import RunSummary
    from cairn.checkpoint import CheckpointRef, compare_states, latest_committed
    from cairn.config import load_config
    from cairn.session import TrainingSession
    from cairn.stores import LocalStore, MemoryStore
    from cairn.training import load_training
    from workers.client import WORKFLOW_TASK_TIMEOUT, connect
    from workflows.training_run import TrainingRun

    print("== Part 2: a durable run on Temporal, with a worker SIGKILLed partway")
    cfg = StackConfig(state_dir=STATE)
    info = dev_stack(cfg)
    queue = f"cairn-demo-{uuid.uuid4().hex[:6]}"
    store = STATE / "demo-runs"
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    config = load_config(REPO / "examples" / "config.json")
    total, every = 120, 20
    inp = TrainingRunInput(
        run_id=run_id,
        config=config,
        total_steps=total,
        store=str(store),
        steps_per_segment=60,
        checkpoint={"every": every},
        heartbeat_timeout_seconds=4,
        throttle_seconds_per_step=0.04,
    )

    def worker(name: str) -> ServerProcess:
        return demo_worker(name, cfg.temporal_address, queue)

    client = await connect(cfg.temporal_address)
    first = worker("worker-a")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        print(f"started TrainingRun {run_id}: {total} steps, segments of 60, checkpoint every {every}")
        local = LocalStore(store)
        while (ref := latest_committed(local, run_id)) is None or ref.step < 30:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # about 12 steps past the last checkpoint: those are lost and redone
        os.killpg(first.pid, signal.SIGKILL)
        durable = latest_committed(local, run_id)
        assert durable is not None
        print(f"SIGKILL worker A (pid {first.pid}) mid-segment; last durable checkpoint: step {durable.step}")
        second = worker("worker-b")
        print(f"started worker B (pid {second.pid}); Temporal retries the segment after the heartbeat timeout")
        bar = ProgressDisplay(run_id, total)  # a bar on a terminal, lines into a pipe or a log
        steps = StepProgress()  # the bar shows the highest step reached; a retry's recomputation is said
        phase: dict[str, object] = {}
        while True:
            desc = await handle.describe()  # the server's view: no worker needed
            segment = running_segment(desc)
            if segment is not None:
                for note in steps.see(segment[1], segment[0], durable.step):
                    bar.note(note)
            with contextlib.suppress(RPCError):  # the killed worker held the run's workflow: no answer until B polls
                progress = await handle.query(TrainingRun.progress, rpc_timeout=timedelta(seconds=5))
                phase = {"phase": progress.phase, "attempts": progress.attempts}
                steps.highest = max(steps.highest, progress.step)  # the segments done (no step within one)
            bar.show(steps.highest, {**phase, **steps.postfix()})
            if desc.status is not None and desc.status.name != "RUNNING":
                break
            await asyncio.sleep(0.3)
        bar.close()
        summary = RunSummary.model_validate(await handle.result())
    finally:
        first.stop()
        if second is not None:
            second.stop(grace=10)
    print(
        f"run finished: {summary.steps} steps, attempts per segment {summary.attempts}, "
        f"steps recomputed after the kill: {summary.recomputed_steps} (counted from the dead worker's last "
        f"heartbeat, at most ~0.3 s stale; at most the checkpoint interval, {every})"
    )
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref)
    reference = TrainingSession.fresh("reference", MemoryStore("demo-reference"), config)
    reference.run(total)
    diffs = compare_states(state, reference.state)
    if not diffs:
        print(f"VERDICT: BIT-IDENTICAL — the killed-and-resumed run == {total} uninterrupted in-process updates")
        print(f"         fingerprint {manifest.fingerprint}")
    else:
        print("VERDICT: DIFFERENT —", ", ".join(d.field for d in diffs))
    print(f"\nWeb UI:  {info['web_ui']}/namespaces/default/workflows/{run_id}")
    print(f"Checkpoints: cairn ckpt list {store} --run {run_id}")
    return not diffs and summary.attempts[0] >= 2 and 0 < summary.recomputed_steps <= every, str(info["web_ui"])


async def digits_on_temporal(web_ui: str) -> bool:
    """Part 3: the PyTorch adapter on Temporal, by epochs, through a SIGKILL."""
    import numpy as np

    from activities.inputs import TrainingRunInput
    from activities.views import RunSummary
    from cairn.checkpoint import CheckpointRef, compare_states, latest_committed
    from cairn.config import load_config
    from cairn.session import TrainingSession
    from cairn.stores import LocalStore, MemoryStore
    from cairn.training import load_training
    from workers.client import WORKFLOW_TASK_TIMEOUT, connect
    from workflows.training_run import TrainingRun

    print("\n== Part 3: your own PyTorch model — the digits CNN, durably on Temporal, epoch by epoch")
    cfg = StackConfig(state_dir=STATE)
    queue = f"cairn-demo-{uuid.uuid4().hex[:6]}"
    store = STATE / "demo-runs"
    run_id = f"digits-{time.strftime('%Y%m%d-%H%M%S')}"
    config = load_config(REPO / "examples" / "digits.json")
    epochs, every = 4, 10
    inp = TrainingRunInput(
        run_id=run_id,
        config=config,
        total_epochs=epochs,
        segment={"epochs": 1},
        store=str(store),
        checkpoint={"every": every},
        heartbeat_timeout_seconds=4,
        throttle_seconds_per_step=0.01,
    )

    def worker(name: str) -> ServerProcess:
        return demo_worker(name, cfg.temporal_address, queue, preload="examples.digits")

    client = await connect(cfg.temporal_address)
    first = worker("worker-c")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        print(f"started TrainingRun {run_id}: trainer examples.digits:DigitsCNN, {epochs} epochs, one segment each")
        local = LocalStore(store)
        while (progress := await handle.query(TrainingRun.progress)).steps_per_epoch is None:
            await asyncio.sleep(0.1)
        spe = progress.steps_per_epoch
        while (ref := latest_committed(local, run_id)) is None or ref.step < spe + every:
            await asyncio.sleep(0.02)
        os.killpg(first.pid, signal.SIGKILL)
        print(f"SIGKILL worker (pid {first.pid}) in epoch 2 (last durable checkpoint: step {ref.step}); new worker")
        second = worker("worker-d")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
    finally:
        first.stop()
        if second is not None:
            second.stop(grace=10)
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref)
    loss = np.asarray(state.history["loss"])
    for i, (at, vloss, vacc) in enumerate(
        zip(state.history["val_step"], state.history["val_loss"], state.history["val_accuracy"], strict=True)
    ):
        start = int(at) - spe
        train_loss = loss[start : int(at)].mean()
        print(f"epoch {i + 1}: train loss {train_loss:.4f}   val loss {vloss:.4f}   val accuracy {vacc:.3f}")
    reference = TrainingSession.fresh("reference", MemoryStore("demo-digits-reference"), config)
    reference.run(summary.steps)
    diffs = compare_states(state, reference.state)
    print(
        f"run finished: {summary.steps} steps in {summary.segments} segments, attempts {summary.attempts}, "
        f"contract {summary.reproducibility}"
    )
    if not diffs:
        print("VERDICT: BIT-IDENTICAL — parameters, BatchNorm buffers, AdamW moments, cosine schedule,")
        print("         torch/numpy/python RNGs and the epoch cursor == the uninterrupted in-process run")
        print(f"         fingerprint {manifest.fingerprint}")
    else:
        print("VERDICT: DIFFERENT —", ", ".join(d.field for d in diffs[:8]))
    print(f"Web UI:  {web_ui}/namespaces/default/workflows/{run_id}")
    print(f"Evaluate on the held-out test split once: cairn eval {summary.checkpoint} --split test")
    return not diffs and summary.attempts[1] >= 2


async def distributed_on_temporal(web_ui: str) -> bool:
    """Part 4: one run over several workers: W=4 ranks on two nodes, then resumed at W=2."""
    from activities.inputs import TrainingRunInput
    from activities.views import RunSummary
    from cairn.checkpoint import CheckpointRef, compare_states, read_manifest
    from cairn.config import load_config
    from cairn.session import TrainingSession
    from cairn.stores import LocalStore, MemoryStore
    from cairn.training import load_training
    from workers.client import WORKFLOW_TASK_TIMEOUT, connect
    from workflows.training_run import TrainingRun

    print("\n== Part 4: one run over several workers — 4 ranks on two nodes, resumed at 2 ranks, bit for bit")
    cfg = StackConfig(state_dir=STATE)
    queue = f"cairn-demo-{uuid.uuid4().hex[:6]}"
    store = STATE / "demo-runs"
    run_id = f"dp-{time.strftime('%Y%m%d-%H%M%S')}"
    config = load_config(REPO / "examples" / "distributed.json")
    assert config.distributed is not None
    half, total = 40, 80
    base = {"run_id": run_id, "config": config, "store": str(store), "checkpoint": {"every": 20}}
    client = await connect(cfg.temporal_address)
    nodes = [demo_worker(f"node-{n}", cfg.temporal_address, queue, node=f"node-{n}") for n in "ab"]
    try:
        summaries = []
        for world, hosts, steps in ((4, ["node-a", "node-b"], half), (2, [], total)):
            inp = TrainingRunInput.model_validate(
                {**base, "total_steps": steps, "steps_per_segment": half, "world_size": world, "nodes": hosts}
            )
            where = f"{len(hosts)} nodes x {world // len(hosts)} ranks" if hosts else f"{world} ranks on one node"
            handle = await client.start_workflow(
                TrainingRun.run, inp, id=f"{run_id}-w{world}", task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
            )
            summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=300))
            summaries.append(summary)
            assert summary.checkpoint is not None
            ref = CheckpointRef.parse(summary.checkpoint)
            ranks = read_manifest(LocalStore(ref.store_url), ref, expect_kind=None, expand_index=False).writer.ranks
            print(
                f"world size {world} ({where}): trained to step {summary.steps}, loss {summary.loss:.4f}; "
                f"checkpoint {ref.step} written by {ranks} ranks, each its own blocks, one commit"
            )
    finally:
        for n in nodes:
            n.stop(grace=10)
    final = summaries[-1]
    assert final.checkpoint is not None
    ref = CheckpointRef.parse(final.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref)
    reference = TrainingSession.fresh("reference", MemoryStore("demo-dp-reference"), config)
    reference.run(total)
    diffs = compare_states(state, reference.state)
    m = config.distributed.microbatches
    if not diffs:
        print(f"VERDICT: BIT-IDENTICAL — {half} steps at W=4 + {total - half} resumed at W=2 == {total} uninterrupted")
        print(f"         steps in one process ({m} microbatches summed in one tree order, whatever the world size)")
        print(f"         fingerprint {manifest.fingerprint}")
    else:
        print("VERDICT: DIFFERENT —", ", ".join(d.field for d in diffs[:8]))
    print(f"Web UI:  {web_ui}/namespaces/default/workflows/{run_id}-w4")
    print(
        "\nThe stack keeps running for you to look around, with a supervised worker polling 'cairn-training' "
        "(.venv/bin/cairn dev status;\nthe environment of a worker you start by hand: "
        'eval "$(.venv/bin/cairn dev env)"); stop it with: .venv/bin/cairn dev down'
    )
    return not diffs


def main() -> int:
    from cairn.numerics import enter_profile, process_profile_name

    profile = enter_profile(process_profile_name(), reexec=True)  # its references and its workers alike
    print(f"numerics profile {profile.id} on a {profile.native} machine; state in {STATE}")
    seed_store = STATE / "demo-store"
    if seed_store.exists():
        shutil.rmtree(seed_store)
    ok = seed_scenario(seed_store, REPO / "examples" / "config.json")
    drilled, web_ui = asyncio.run(temporal_drill())
    ok = asyncio.run(digits_on_temporal(web_ui)) and drilled and ok
    ok = asyncio.run(distributed_on_temporal(web_ui)) and ok
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)  # skip interpreter teardown, which the Temporal client's native threads can abort


if __name__ == "__main__":
    main()
