"""``cairn train``: training in this process, checkpointing to a store, or as a gang of rank
processes on this host (``--world-size``); a signal commits a checkpoint before it stops."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cairn.checkpoint import CheckpointRef, latest_committed, read_manifest
from cairn.checkpoint.validate import manifest_config
from cairn.config import TrainConfig, load_config, parse_config
from cairn.errors import CommandInterrupted, ConfigError
from cairn.gang.job import GangJob
from cairn.session import MAX_STEPS, TrainingSession, default_run_id
from cairn.stores.base import Store
from cairn.trainers.loading import normalized_config, require_trusted
from workers.cli.args import Common, add_numerics_arg, count, run_id_arg, store_arg
from workers.cli.output import emit

__all__ = ["cmd_train", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("train", help="train in-process, checkpointing to a store")
    common(p)
    p.add_argument("--config", help="trainer config JSON (see examples/config.json)")
    p.add_argument(
        "--steps",
        type=count,
        required=True,
        help="number of updates to run (from --resume's step, else from step 0; with --world-size and no "
        "--resume: from the run's latest checkpoint)",
    )
    p.add_argument("--store", required=True, help="directory or s3://bucket/prefix")
    p.add_argument("--checkpoint-every", type=count, help="commit a checkpoint every K steps")
    p.add_argument("--resume", metavar="CKPT", help="checkpoint reference to resume from")
    p.add_argument("--weights-only", action="store_true", help="resume theta only (does NOT reproduce training)")
    p.add_argument("--run-id", help="run id (default: derived from the config, or the resumed run's)")
    p.add_argument(
        "--trainer",
        metavar="MODULE:CLASS",
        help="trainer by import path (default: the config's, else the built-in MLP)",
    )
    p.add_argument(
        "--world-size",
        type=count,
        metavar="W",
        help="train as W rank processes under torchrun on this host (needs config.distributed; any W dividing "
        "distributed.microbatches gives the same bits)",
    )
    add_numerics_arg(p, "trains")
    p.add_argument(
        "--tolerance",
        action="store_true",
        help="resume a bit-exact checkpoint computed under another numerics profile (recorded in its lineage: "
        "the result is then equal to an uninterrupted run only within a tolerance)",
    )
    p.set_defaults(handler=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if not 0 <= args.steps <= MAX_STEPS:
        raise ConfigError("--steps", expected=f"0..{MAX_STEPS}", found=args.steps)
    if args.checkpoint_every is not None and args.checkpoint_every <= 0:
        raise ConfigError("--checkpoint-every", expected="> 0", found=args.checkpoint_every)
    run_id_arg(args.run_id, "--run-id")
    store = store_arg(args.store, must_exist=False)
    config = load_config(args.config) if args.config else None
    if args.trainer is not None:
        config = _with_trainer(config, args.trainer)
    if args.world_size is not None:
        return _train_gang(args, store, config)
    if args.resume:
        ref = CheckpointRef.parse(args.resume)
        default_id = f"{ref.run_id}-weights-only" if args.weights_only else ref.run_id
        run_id = args.run_id if args.run_id is not None else default_id
        session = TrainingSession.from_checkpoint(
            ref,
            run_id=run_id,
            store=store,
            config=config,
            weights_only_restore=args.weights_only,
            tolerate_numerics=args.tolerance,
        )
    else:
        if config is None:
            raise ConfigError("--config is required unless --resume is given")
        if args.weights_only:
            raise ConfigError("--weights-only only makes sense with --resume")
        run_id = args.run_id if args.run_id is not None else default_run_id(normalized_config(config))
        session = TrainingSession.fresh(run_id, store, config)
    bar = tqdm(total=args.steps, desc=f"train {session.run_id}", unit="step", disable=None, leave=False)
    interrupted = False
    stopped_by = signal.SIGINT

    def on_sigint(sig: int, _frame: object) -> None:
        nonlocal interrupted, stopped_by
        interrupted, stopped_by = True, signal.Signals(sig)  # the step in progress finishes, then a commit
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and so does a second SIGTERM

    def on_step(state: Any) -> bool:
        bar.update(1)
        if state.history["loss"]:
            shown = {"loss": f"{state.history['loss'][-1]:.4f}"}
            if state.history.get("val_accuracy"):
                shown["val_acc"] = f"{state.history['val_accuracy'][-1]:.3f}"
            bar.set_postfix(shown, refresh=False)
        return interrupted

    started = time.perf_counter()
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_term = signal.signal(signal.SIGTERM, on_sigint)  # a service manager's stop: the same
    try:
        result = session.run(args.steps, checkpoint_every=args.checkpoint_every, on_step=on_step)
    except KeyboardInterrupt:
        last = session.durable_ref
        raise CommandInterrupted(
            "aborted by a second Ctrl-C; "
            + (f"last committed checkpoint: {last}" if last else "no checkpoint was committed")
            + (f"; resume with: {_resume_command(args, str(last), session.run_id)}" if last else "")
        ) from None
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        bar.close()
    assert result is not None
    state = session.state
    if interrupted:
        done = state.step - (session.restored_from.step if session.restored_from else 0)
        left = max(0, args.steps - done)
        print(
            f"cairn: interrupted at step {state.step}: checkpoint {result.ref} committed; "
            f"resume with: {_resume_command(args, str(result.ref), session.run_id, left)}",
            file=sys.stderr,
        )
    loss = state.history["loss"][-1] if state.history["loss"] else None
    payload = {
        "checkpoint": str(result.ref),
        "run_id": session.run_id,
        "step": state.step,
        "cursor": state.cursor,
        "fingerprint": result.manifest.fingerprint,
        "loss": loss,
        "created": result.created,
        "seconds": round(time.perf_counter() - started, 3),
        "interrupted": interrupted,
    }
    emit(args, payload, str(result.ref))
    return 128 + stopped_by if interrupted else 0


def _train_gang(args: argparse.Namespace, store: Store, config: TrainConfig | None) -> int:
    """``cairn train --world-size W``: a gang of W rank processes on this host (torchrun),
    resuming the run's latest committed checkpoint (or ``--resume``), to ``--steps`` more."""
    from tqdm import tqdm

    from cairn.distributed.partition import check_world_size  # here: only a gang pays for these imports
    from cairn.gang.launch import Gang, GangSpec

    if args.weights_only:
        raise ConfigError("--weights-only", expected="a single-process run (no --world-size)", found=True)
    resume_from: str | None = None
    if args.resume:
        ref = CheckpointRef.parse(args.resume)
        if store_arg(ref.store_url, must_exist=False).url.rstrip("/") != store.url.rstrip("/"):
            raise ConfigError("--resume", expected=f"a checkpoint in --store {store.url}", found=str(ref))
        ref = CheckpointRef(store.url, ref.run_id, ref.kind, ref.step)  # the ranks run elsewhere: absolute
        run_id = args.run_id or ref.run_id
        if run_id != ref.run_id:
            raise ConfigError("--run-id", expected=ref.run_id, found=run_id)
        manifest = read_manifest(store, ref, expect_kind=None)
        found = manifest_config(manifest)
        require_trusted(found, config)  # the ranks import the trainer: only one the trust rule allows
        trust_checkpoint = config is None
        config = config or found
        start, resume_from = ref.step, str(ref)
    else:
        if config is None:
            raise ConfigError("--config is required unless --resume is given")
        run_id = args.run_id if args.run_id is not None else default_run_id(normalized_config(config))
        latest = latest_committed(store, run_id)
        start = latest.step if latest is not None else 0
        trust_checkpoint = False
    if config.distributed is None:
        raise ConfigError("--world-size", expected="a config with a 'distributed' section", found=args.world_size)
    check_world_size(config.distributed.microbatches, args.world_size, "--world-size")
    target = start + args.steps
    job = GangJob(
        run_id=run_id,
        store=store.url,
        config=config,
        target_step=target,
        checkpoint_every=args.checkpoint_every or max(1, args.steps),
        resume_from=resume_from,
        config_from_checkpoint=trust_checkpoint,
        tolerate_numerics=args.tolerance,
    )
    bar = tqdm(total=target, initial=start, desc=f"train {run_id} x{args.world_size}", unit="step", disable=None)
    stop = False
    stopped_by = signal.SIGINT

    def on_sigint(sig: int, _frame: object) -> None:
        nonlocal stop, stopped_by
        if stop:  # a second Ctrl-C/SIGTERM aborts at once: supervise() kills the gang on its way out
            raise KeyboardInterrupt
        stop, stopped_by = True, signal.Signals(sig)  # the ranks finish the step, checkpoint together, exit

    def on_progress(doc: dict[str, Any]) -> None:
        if isinstance(doc.get("step"), int):
            bar.n = doc["step"]
            if doc.get("loss") is not None:
                bar.set_postfix(loss=f"{doc['loss']:.4f}", refresh=False)
            bar.refresh()

    started = time.perf_counter()
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_term = signal.signal(signal.SIGTERM, on_sigint)  # a service manager's stop: the same
    try:
        with tempfile.TemporaryDirectory(prefix="cairn-gang-") as tmp:
            gang = Gang(GangSpec(nproc_per_node=args.world_size), job, Path(tmp))
            gang.start()
            out = gang.supervise(on_progress=on_progress, cancelled=lambda: stop)
    except KeyboardInterrupt:
        last = latest_committed(store, run_id)
        raise CommandInterrupted(
            "aborted by a second signal; the gang was stopped; "
            + (f"last committed checkpoint: {last}" if last else "no checkpoint was committed")
            + (
                f"; resume with: cairn train --resume {last} --steps {target - last.step} --store {args.store} "
                f"--world-size {args.world_size}"
                if last
                else ""
            )
        ) from None
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        bar.close()
    payload = {
        "checkpoint": out.checkpoint,
        "run_id": run_id,
        "step": out.step,
        "cursor": out.cursor,
        "fingerprint": out.fingerprint,
        "loss": out.loss,
        "world_size": out.world_size,
        "resumed_from_step": out.resumed_from_step,
        "seconds": round(time.perf_counter() - started, 3),
        "interrupted": out.interrupted,
    }
    if out.interrupted:
        print(
            f"cairn: interrupted at step {out.step}: checkpoint {out.checkpoint} committed; resume with: "
            f"cairn train --resume {out.checkpoint} --steps {target - out.step} --store {args.store} "
            f"--world-size {args.world_size}",
            file=sys.stderr,
        )
    emit(args, payload, str(out.checkpoint))
    return 128 + stopped_by if out.interrupted else 0


def _with_trainer(config: TrainConfig | None, factory: str) -> TrainConfig:
    """The config with ``trainer.factory`` set from ``--trainer`` (its options kept)."""
    body = config.to_json() if config is not None else {}
    options = (body.get("trainer") or {}).get("options", {})
    return parse_config({**body, "trainer": {"factory": factory, "options": options}}, "--trainer")


def _resume_command(args: argparse.Namespace, ref: str, run_id: str, steps: int | None = None) -> str:
    return f"cairn train --resume {ref} --steps {steps if steps is not None else 'N'} --store {args.store}" + (
        f" --run-id {run_id}" if run_id != CheckpointRef.parse(ref).run_id else ""
    )
