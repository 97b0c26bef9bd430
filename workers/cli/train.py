"""``cairn train``: training in this process, checkpointing to a store, or as a gang of rank
processes on this host (``--world-size``); a signal commits a checkpoint before it stops.

Every precondition is checked before the first step (config, trainer, resume target, the
store's writability, the run id), each failure one typed line; without ``--checkpoint-every``
a checkpoint is committed once an epoch (``default_checkpoint_every``), and the cadence used is
printed."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cairn.checkpoint import CheckpointOptions, CheckpointRef, latest_committed, manifest_config, read_manifest
from cairn.config import TrainConfig, load_config, parse_config
from cairn.errors import CommandInterrupted, ConfigError, GangFailedError
from cairn.gang import GangJob
from cairn.runs import require_same_config, require_writable
from cairn.session import MAX_STEPS, TrainingSession, default_run_id
from cairn.stores import Store
from cairn.trainers import Trainer, load_trainer, normalized_config, require_trusted
from workers.cli.args import Common, add_numerics_arg, add_set_arg, count, run_id_arg, store_arg
from workers.cli.output import emit

__all__ = ["DEFAULT_MAX_INTERVAL", "cmd_train", "default_checkpoint_every", "register"]

DEFAULT_MAX_INTERVAL = 1000
"""The longest default checkpoint interval in steps (an epoch longer than this is cut into parts)."""


def default_checkpoint_every(trainer: Trainer) -> int:
    """The cadence without ``--checkpoint-every``: once an epoch (``steps_per_epoch`` updates),
    and at most ``DEFAULT_MAX_INTERVAL`` steps apart, so a killed run loses at most that."""
    return max(1, min(trainer.steps_per_epoch, DEFAULT_MAX_INTERVAL))


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("train", help="train in-process, checkpointing to a store")
    common(p)
    p.add_argument("--config", help="trainer config: JSON, YAML or TOML by extension (see examples/config.json)")
    add_set_arg(p, "the config")
    p.add_argument(
        "--steps",
        type=count,
        required=True,
        help="number of updates to run (from --resume's step, else from step 0; with --world-size and no "
        "--resume: from the run's latest checkpoint)",
    )
    p.add_argument("--store", required=True, help="directory or s3://bucket/prefix")
    p.add_argument(
        "--checkpoint-every",
        type=count,
        help=f"commit a checkpoint every K steps (default: once an epoch, at most every {DEFAULT_MAX_INTERVAL} "
        "steps; and always at the end)",
    )
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
    if args.set and not args.config:
        raise ConfigError("--set", expected="--config FILE to apply it to", found=" ".join(args.set))
    config = load_config(args.config, args.set) if args.config else None
    if args.trainer is not None:
        config = _with_trainer(config, args.trainer)
    if args.world_size is not None:
        return _train_gang(args, store, config)
    if args.resume:
        ref = CheckpointRef.parse(args.resume)
        default_id = f"{ref.run_id}-weights-only" if args.weights_only else ref.run_id
        run_id = args.run_id if args.run_id is not None else default_id
        require_writable(store, run_id)  # before the restore reads (and checks) every tensor
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
        require_writable(store, run_id)
        options = CheckpointOptions.from_env()  # the command's edge: read once, for the check and the session
        require_same_config(store, run_id, config, options)
        session = TrainingSession.fresh(run_id, store, config, options=options)
    start = session.state.step
    every = args.checkpoint_every or default_checkpoint_every(session.trainer)
    _say(args, _cadence_line(args, session.run_id, store, start, every, session.trainer))
    bar = tqdm(total=args.steps, desc=f"train {session.run_id}", unit="step", disable=None, leave=False)
    interrupted = False
    stopped_by = signal.SIGINT

    def on_sigint(sig: int, _frame: object) -> None:
        nonlocal interrupted, stopped_by
        interrupted, stopped_by = True, signal.Signals(sig)  # the step in progress finishes, then a commit
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and so does a second SIGTERM

    shown: dict[str, str] = {}

    def on_step(state: Any) -> bool:
        bar.update(1)
        if state.history["loss"]:
            shown["loss"] = f"{state.history['loss'][-1]:.4f}"
            if state.history.get("val_accuracy"):
                shown["val_acc"] = f"{state.history['val_accuracy'][-1]:.3f}"
            bar.set_postfix(shown, refresh=False)
        return interrupted

    def on_checkpoint(result: Any) -> None:
        shown["committed"] = str(result.manifest.step)
        if bar.disable:  # no live bar (not a terminal, e.g. a log file): one line per commit
            loss = f" (loss {shown['loss']})" if "loss" in shown else ""
            _say(args, f"cairn: step {result.manifest.step}/{start + args.steps} committed{loss}: {result.ref}")

    started = time.perf_counter()
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_term = signal.signal(signal.SIGTERM, on_sigint)  # a service manager's stop: the same
    try:
        result = session.run(args.steps, checkpoint_every=every, on_step=on_step, on_checkpoint=on_checkpoint)
    except KeyboardInterrupt:
        last = session.durable_ref
        raise CommandInterrupted(
            "aborted by a second Ctrl-C; "
            + (f"last committed checkpoint: {last}" if last else "no checkpoint was committed")
            + (f"; resume with: {_resume_command(args, store, str(last), session.run_id)}" if last else "")
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
            f"resume with: {_resume_command(args, store, str(result.ref), session.run_id, left)}",
            file=sys.stderr,
        )
    loss = state.last("loss")
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
        "checkpoint_every": every,
    }
    emit(args, payload, str(result.ref))
    return 128 + stopped_by if interrupted else 0


def _train_gang(args: argparse.Namespace, store: Store, config: TrainConfig | None) -> int:
    """``cairn train --world-size W``: a gang of W rank processes on this host (torchrun),
    resuming the run's latest committed checkpoint (or ``--resume``), to ``--steps`` more."""
    from tqdm import tqdm

    from cairn.distributed import check_world_size  # here: only a gang pays for these imports
    from cairn.gang import Gang, GangSpec

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
        manifest = read_manifest(store, ref, expect_kind=None, expand_index=False)
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
    require_writable(store, run_id)
    trainer = load_trainer(config, on_host=True)  # once: a trainer that cannot build fails before W ranks start
    every = args.checkpoint_every or default_checkpoint_every(trainer)
    _say(args, _cadence_line(args, run_id, store, start, every, trainer))
    target = start + args.steps
    job = GangJob(
        run_id=run_id,
        store=store.url,
        config=config,
        target_step=target,
        checkpoint_every=every,
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

    last_commit = start

    def on_progress(doc: dict[str, Any]) -> None:
        nonlocal last_commit
        if isinstance(doc.get("step"), int):
            bar.n = doc["step"]
            if doc.get("loss") is not None:
                bar.set_postfix(loss=f"{doc['loss']:.4f}", refresh=False)
            bar.refresh()
        committed = doc.get("committed_step")
        if isinstance(committed, int) and committed > last_commit:
            last_commit = committed
            if bar.disable:  # no live bar (not a terminal): one line per commit
                _say(args, f"cairn: step {committed}/{target} committed by {args.world_size} ranks")

    started = time.perf_counter()
    gang: Gang | None = None
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_term = signal.signal(signal.SIGTERM, on_sigint)  # a service manager's stop: the same
    try:
        with tempfile.TemporaryDirectory(prefix="cairn-gang-") as tmp:
            gang = Gang(GangSpec(nproc_per_node=args.world_size), job, Path(tmp))
            gang.start()
            out = gang.supervise(on_progress=on_progress, cancelled=lambda: stop)
    except (KeyboardInterrupt, GangFailedError) as exc:
        if isinstance(exc, GangFailedError) and not (gang is not None and gang.stopped_before_training):
            raise  # the gang's own failure (a rank died or hung), whatever signal came before it
        # A second signal, or the first before the ranks began training (nothing to checkpoint).
        how = "aborted by a second signal" if isinstance(exc, KeyboardInterrupt) else "stopped before training began"
        last = latest_committed(store, run_id)
        raise CommandInterrupted(
            f"{how}; the gang was stopped; "
            + (f"last committed checkpoint: {last}" if last else "no checkpoint was committed")
            + (
                f"; resume with: {_resume_command(args, store, str(last), run_id, target - last.step)} "
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
        "checkpoint_every": every,
    }
    if out.interrupted:
        resume = _resume_command(args, store, str(out.checkpoint), run_id, target - out.step)
        print(
            f"cairn: interrupted at step {out.step}: checkpoint {out.checkpoint} committed; resume with: "
            f"{resume} --world-size {args.world_size}",
            file=sys.stderr,
        )
    emit(args, payload, str(out.checkpoint))
    return 128 + stopped_by if out.interrupted else 0


def _with_trainer(config: TrainConfig | None, factory: str) -> TrainConfig:
    """The config with ``trainer.factory`` set from ``--trainer`` (its options kept)."""
    body = config.to_json() if config is not None else {}
    options = (body.get("trainer") or {}).get("options", {})
    return parse_config({**body, "trainer": {"factory": factory, "options": options}}, "--trainer")


def _resume_command(args: argparse.Namespace, store: Store, ref: str, run_id: str, steps: int | None = None) -> str:
    """The command that continues from ``ref`` as this one would have: with every option that
    shaped the run — the config (and ``--trainer``) this one was given, so that the trainer they
    name is trusted as the run's own (``cairn.trainers.loading``), the checkpoint cadence, the
    numerics profile, the S3 endpoint — and absolute paths, so it works from any directory."""
    words = ["cairn", "train", "--resume", ref, "--steps", "N" if steps is None else str(steps), "--store", store.url]
    if run_id != CheckpointRef.parse(ref).run_id:
        words += ["--run-id", run_id]
    if args.checkpoint_every:
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    words += ["--numerics", args.numerics]
    if args.endpoint_url:
        words += ["--endpoint-url", args.endpoint_url]
    if args.config:
        words += ["--config", os.path.abspath(args.config)]
        for item in args.set:
            words += ["--set", item]
    if args.trainer:
        words += ["--trainer", args.trainer]
    return shlex.join(words)


def _cadence_line(args: argparse.Namespace, run_id: str, store: Store, start: int, every: int, trainer: Trainer) -> str:
    """What this command will do, said before its first step: the run, its steps, its cadence."""
    if args.checkpoint_every:
        why = "--checkpoint-every"
    elif every == trainer.steps_per_epoch:
        why = "once an epoch; --checkpoint-every K to change"
    else:
        why = f"an epoch is {trainer.steps_per_epoch} steps, longer than the default's {DEFAULT_MAX_INTERVAL}"
    return (
        f"cairn: run {run_id}: steps {start}..{start + args.steps} into {store.url}, "
        f"a checkpoint every {every} steps ({why}) and at the end"
    )


def _say(args: argparse.Namespace, line: str) -> None:
    """A progress line on stderr (none with ``--json``: scripts read one object and errors)."""
    if not args.json:
        print(line, file=sys.stderr, flush=True)
