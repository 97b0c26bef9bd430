"""The ``cairn`` command line.

Exit codes: 0 success; 1 a checkpoint was refused, ``compare`` found differences, training
diverged, or a run failed; 2 bad input (usage, config, reference, path); 3 storage failure;
4 an external effect failed; 5 Temporal unreachable or refused the request; 130 / 143 interrupted by
SIGINT / SIGTERM (``train`` commits a checkpoint first).
The code of an error is declared on its class (``cairn.errors``).
Errors print one line on stderr (``cairn: error: <Type>: <field>: <what> (expected ..., found
...)``); with ``--json`` the error is also one JSON object on stdout; ``--debug`` adds the
traceback. ``--json`` prints exactly one JSON object on stdout, always valid JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cairn.checkpoint import (
    CheckpointKind,
    CheckpointRef,
    list_checkpoints,
    load_training,
    read_manifest,
    verify_tensors,
)
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.layout import RUN_ID_PATTERN
from cairn.checkpoint.manager import load_training_with_trainer
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin, pinned_steps, unpin
from cairn.checkpoint.validate import check_training_manifest, manifest_config
from cairn.config import BUILTIN_TRAINER, TrainConfig, load_config, parse_config
from cairn.errors import CairnError, CommandInterrupted, ConfigError, StoreNotFoundError
from cairn.numerics import NumericsRecord, enter_profile
from cairn.runs.exposures import exposure_count, record_test_exposure
from cairn.session import MAX_STEPS, TrainingSession, default_run_id
from cairn.stores import open_store
from cairn.stores.base import Store
from cairn.trainers.base import (
    Trainer,
    check_finite,
    load_trainer,
    normalized_config,
    require_trusted,
    trainer_for_checkpoint,
)
from workers.cli.args import add_numerics_arg

Handler = Callable[[argparse.Namespace], int]


class CommandFailed(Exception):
    """A command's verdict is negative (e.g. compare found differences); already reported."""

    def __init__(self, code: int) -> None:
        self.code = code


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats become strings, so output stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def to_json(payload: dict[str, Any]) -> str:
    return json.dumps(_finite(payload), sort_keys=True, default=str, allow_nan=False)


def emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(to_json(payload) if args.json else text)


def _ref(text: str) -> CheckpointRef:
    return CheckpointRef.parse(text)


def _run_id_arg(value: str | None, flag: str) -> str | None:
    if value is not None and not RUN_ID_PATTERN.match(value):
        raise ConfigError(flag, expected=f"a run id matching {RUN_ID_PATTERN.pattern}", found=value)
    return value


def _store_arg(url: str, *, must_exist: bool) -> Store:
    """Open a store named on the command line; reading commands refuse one that does not exist."""
    expected = "a directory path or s3://bucket/prefix"
    if not url or not url.strip():
        raise ConfigError("--store", expected=expected, found=url)
    if "://" in url and not url.startswith(("s3://", "file://", "memory://")):
        raise ConfigError("store", expected=expected, found=f"{url} (unsupported scheme)")
    store = open_store(url)
    if must_exist and not store.root_exists():
        raise StoreNotFoundError(
            "store", expected="an existing store (a directory, or a bucket and prefix written by cairn)", found=url
        )
    return store


def _count(text: str) -> int:
    """An integer argument in ASCII digits (``int()`` would also take other scripts' digits)."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, found {text!r}")
    return int(text)


class CairnArgumentParser(argparse.ArgumentParser):
    """Usage errors become a ``UsageError``: one line, exit 2, and a JSON object with --json."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


class UsageError(ConfigError):
    """The command line itself is wrong (an unknown flag, a missing or malformed argument)."""


# -- train ----------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if not 0 <= args.steps <= MAX_STEPS:
        raise ConfigError("--steps", expected=f"0..{MAX_STEPS}", found=args.steps)
    if args.checkpoint_every is not None and args.checkpoint_every <= 0:
        raise ConfigError("--checkpoint-every", expected="> 0", found=args.checkpoint_every)
    _run_id_arg(args.run_id, "--run-id")
    store = _store_arg(args.store, must_exist=False)
    config = load_config(args.config) if args.config else None
    if args.trainer is not None:
        config = _with_trainer(config, args.trainer)
    if args.world_size is not None:
        return _train_gang(args, store, config)
    if args.resume:
        ref = _ref(args.resume)
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
    import tempfile

    from tqdm import tqdm

    from cairn.checkpoint import latest_committed, read_manifest
    from cairn.checkpoint.validate import manifest_config
    from cairn.gang.launch import Gang, GangSpec
    from cairn.trainers.mlp.zero import check_world_size

    if args.weights_only:
        raise ConfigError("--weights-only", expected="a single-process run (no --world-size)", found=True)
    resume_from: str | None = None
    if args.resume:
        ref = _ref(args.resume)
        if _store_arg(ref.store_url, must_exist=False).url.rstrip("/") != store.url.rstrip("/"):
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
    job = {
        "run_id": run_id,
        "store": store.url,
        "config": config.model_dump(mode="json"),
        "target_step": target,
        "checkpoint_every": args.checkpoint_every or max(1, args.steps),
        "resume_from": resume_from,
        "config_from_checkpoint": trust_checkpoint,
        "tolerate_numerics": args.tolerance,
    }
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
        "checkpoint": out["checkpoint"],
        "run_id": run_id,
        "step": out["step"],
        "cursor": out["cursor"],
        "fingerprint": out["fingerprint"],
        "loss": out["loss"],
        "world_size": out["world_size"],
        "resumed_from_step": out["resumed_from_step"],
        "seconds": round(time.perf_counter() - started, 3),
        "interrupted": bool(out["interrupted"]),
    }
    if out["interrupted"]:
        print(
            f"cairn: interrupted at step {out['step']}: checkpoint {out['checkpoint']} committed; resume with: "
            f"cairn train --resume {out['checkpoint']} --steps {target - out['step']} --store {args.store} "
            f"--world-size {args.world_size}",
            file=sys.stderr,
        )
    emit(args, payload, str(out["checkpoint"]))
    return 128 + stopped_by if out["interrupted"] else 0


def _with_trainer(config: TrainConfig | None, factory: str) -> TrainConfig:
    """The config with ``trainer.factory`` set from ``--trainer`` (its options kept)."""
    body = config.to_json() if config is not None else {}
    options = (body.get("trainer") or {}).get("options", {})
    return parse_config({**body, "trainer": {"factory": factory, "options": options}}, "--trainer")


def _resume_command(args: argparse.Namespace, ref: str, run_id: str, steps: int | None = None) -> str:
    return f"cairn train --resume {ref} --steps {steps if steps is not None else 'N'} --store {args.store}" + (
        f" --run-id {run_id}" if run_id != CheckpointRef.parse(ref).run_id else ""
    )


# -- ckpt -------------------------------------------------------------------------------------
def cmd_ckpt_show(args: argparse.Namespace) -> int:
    ref = _ref(args.checkpoint)
    store = open_store(ref.store_url)
    manifest = read_manifest(store, ref, expect_kind=None)
    body = manifest.model_dump(mode="json")
    body["checkpoint"] = str(ref)
    lineage = manifest.lineage
    exposures = exposure_count(store, ref.run_id, lineage) if ref.kind == CheckpointKind.TRAINING else 0
    body["final_test_exposures"] = exposures
    if args.json:
        print(to_json(body))
        return 0
    print(f"checkpoint   {ref}")
    print(f"kind         {manifest.kind.value}   format v{manifest.format_version}")
    print(f"run          {manifest.run_id}   step {manifest.step}   cursor {manifest.cursor}")
    print(f"fingerprint  {manifest.fingerprint}  (an identifier, not a signature)")
    print(f"signed       {'yes' if manifest.signature else 'no'}")
    if manifest.parts is None:
        print(f"bytes        {manifest.total_bytes} in {len(manifest.tensors)} tensors, {len(manifest.shards)} shards")
    else:
        print(
            f"bytes        {manifest.total_bytes} in {len(manifest.parts)} tensors cut into {len(manifest.tensors)} "
            f"blocks, {len(manifest.shards)} shards"
        )
    print(f"written by   {manifest.writer.ranks} rank(s)")
    if lineage is not None:
        print(f"dataset      {lineage.dataset_version} {lineage.dataset_hash}")
        print(f"model        {lineage.model_version}   tokenizer {lineage.tokenizer_version}")
        print(f"parent       {lineage.parent or '-'}")
        print(f"trainer      {lineage.trainer or BUILTIN_TRAINER}   contract {lineage.reproducibility or 'bit-exact'}")
        if lineage.model_hash:
            print(f"architecture {lineage.model_hash}")
        print(f"numerics     {_numerics_line(lineage.numerics)}")
        print(f"stage        {lineage.stage_contract}   final-test exposures {exposures}")
        if lineage.reference is not None:
            r = lineage.reference
            print(f"reference    {r.checkpoint} ({r.fingerprint[:19]}...)   may change: {', '.join(r.may_change)}")
        if exposures >= 2:
            print(
                f"warning: the final test split has been evaluated {exposures} times in this lineage; "
                "its score is no longer an unbiased estimate",
                file=sys.stderr,
            )
    for t in manifest.tensors:
        print(f"  {t.name:<24} {t.dtype} {t.shape!s:<14} {t.length:>12} B  {t.checksum[:19]}")
    return 0


def _numerics_line(record: NumericsRecord | None) -> str:
    if record is None:
        return "(not recorded: written before numerics profiles)"
    libs = ", ".join(
        f"{k} {v}" for k, v in record.libraries.items() if k in ("numpy", "openblas", "torch", "blas_kernel")
    )
    mixed = f"; MIXED with {', '.join(record.mixed)} (not bit-exact to either)" if record.mixed else ""
    return f"{record.id}   on a {record.native} machine   ({libs}){mixed}"


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    """Every check of a validated import, streamed: no tensor is ever held whole in memory."""
    ref = _ref(args.checkpoint)
    store = open_store(ref.store_url)
    manifest = read_manifest(store, ref, expect_kind=ref.kind)
    if ref.kind == CheckpointKind.TRAINING:
        config = manifest_config(manifest)
        trainer = None if args.format_only else _trainer_here(config, load_config(args.config) if args.config else None)
        if trainer is not None:
            check_training_manifest(manifest, trainer=trainer)
            verify_tensors(store, ref, manifest, value_check=trainer.check_values)
            data_note = "model and dataset hash checked"
        else:
            verify_tensors(store, ref, manifest, value_check=check_finite)
            data_note = "--format-only: integrity and finiteness checked, not the model or the data"
        detail = f"training state at step {manifest.step}, cursor {manifest.cursor}, {data_note}"
    else:
        verify_tensors(store, ref, manifest)
        detail = f"{ref.kind.value} checkpoint"
    emit(
        args,
        {"checkpoint": str(ref), "ok": True, "fingerprint": manifest.fingerprint, "step": manifest.step},
        f"ok: {ref} ({detail}; {manifest.total_bytes} bytes, every checksum verified)",
    )
    return 0


def _trainer_here(found: TrainConfig, given: TrainConfig | None) -> Trainer:
    """The trainer that checks a checkpoint against its model; when its package or its data is
    not on this machine, say so (exit 2) and point at ``--format-only``: a verify that could
    not check the model must not exit 0."""
    try:
        return trainer_for_checkpoint(found, given)
    except ConfigError as exc:
        if "is not installed" in str(exc) or "data.path" in str(exc) or "dataset file" in str(exc):
            raise ConfigError(
                f"{exc} — the model and data cannot be checked on this machine; "
                "`cairn ckpt verify --format-only` checks integrity alone"
            ) from None
        raise


def cmd_ckpt_compare(args: argparse.Namespace) -> int:
    ref_a, ref_b = _ref(args.a), _ref(args.b)
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ConfigError(flag, expected="a number in [0, 1]", found=value)
    given = load_config(args.config) if args.config else None
    state_a, man_a = load_training(open_store(ref_a.store_url), ref_a, run_config=given)
    state_b, man_b = load_training(open_store(ref_b.store_url), ref_b, run_config=given)
    diffs = compare_states(state_a, state_b, rtol=args.rtol, atol=args.atol)
    tolerant = bool(args.rtol or args.atol)
    profiles = [n.id if (n := s.lineage.numerics) else None for s in (state_a, state_b)]
    payload = {
        "numerics": profiles,
        "a": str(ref_a),
        "b": str(ref_b),
        "identical": not diffs,
        "contract": f"tolerance rtol={args.rtol:g} atol={args.atol:g}" if tolerant else "bit-exact",
        "fingerprints": [man_a.fingerprint, man_b.fingerprint],
        "differences": [d.to_json() for d in diffs],
    }
    if not diffs:
        how = f"within rtol={args.rtol:g}, atol={args.atol:g}" if tolerant else "bit for bit"
        emit(
            args,
            payload,
            f"identical: every tensor, t, rng, cursor, trainer state, history, config and lineage match {how}",
        )
        return 0
    lines = [f"DIFFERENT: {len(diffs)} field(s) differ"]
    if profiles[0] != profiles[1]:
        lines.append(
            f"  computed under numerics profiles {profiles[0] or '(unrecorded)'} and {profiles[1] or '(unrecorded)'}: "
            "states of different profiles are equal only within a tolerance"
        )
    for d in diffs:
        extra = "" if d.max_abs_diff is None else f" (max abs diff {d.max_abs_diff:.6g})"
        lines.append(f"  {d.field}: {d.detail}{extra}")
    emit(args, payload, "\n".join(lines))
    raise CommandFailed(1)


def cmd_ckpt_gc(args: argparse.Namespace) -> int:
    run_id = _run_id_arg(args.run, "--run")
    assert run_id is not None
    store = _store_arg(args.store, must_exist=True)
    if not any(True for _ in store.list(f"{run_id}/")):
        raise ConfigError("--run", expected=f"a run with objects in {store.url}", found=run_id)
    policy = RetentionPolicy(keep_last=args.keep_last, keep_every=args.keep_every, grace_seconds=args.grace_seconds)
    plan = collect_garbage(store, run_id, policy, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"keep   {r}" for r in plan.keep] + [f"{verb} {r}" for r in plan.delete]
    lines += [f"{verb} orphan {k}" for k in plan.orphans]
    lines += [f"{'would abort' if args.dry_run else 'aborted'} incomplete upload {k}" for k in plan.aborted_uploads]
    lines.append(
        f"{verb} {len(plan.delete)} checkpoint(s), {len(plan.orphans)} orphan object(s), {plan.deleted_bytes} bytes"
    )
    emit(args, {"dry_run": args.dry_run, **plan.to_json()}, "\n".join(lines))
    return 0


def cmd_ckpt_pin(args: argparse.Namespace) -> int:
    ref = _ref(args.checkpoint)
    store = open_store(ref.store_url)
    read_manifest(store, ref, expect_kind=None)  # only committed checkpoints can be pinned
    pin(store, ref, args.name)
    emit(args, {"checkpoint": str(ref), "pin": args.name}, f"pinned {ref} as {args.name!r}")
    return 0


def cmd_ckpt_unpin(args: argparse.Namespace) -> int:
    run_id = _run_id_arg(args.run, "--run")
    assert run_id is not None
    store = _store_arg(args.store, must_exist=True)
    unpin(store, run_id, args.name)
    emit(args, {"store": store.url, "run_id": run_id, "unpinned": args.name}, f"unpinned {args.name!r} of {run_id}")
    return 0


def cmd_ckpt_list(args: argparse.Namespace) -> int:
    run_id = _run_id_arg(args.run, "--run")
    store = _store_arg(args.store, must_exist=True)
    refs = list_checkpoints(store, run_id)
    if run_id is not None and not refs:
        raise ConfigError("--run", expected=f"a run with committed checkpoints in {store.url}", found=run_id)
    pins: dict[tuple[str, str, int], list[str]] = {}
    for run in sorted({r.run_id for r in refs}):
        for (kind, step), names in pinned_steps(store, run).items():
            pins[(run, kind, step)] = sorted(names)
    rows = []
    lines = []
    for r in refs:
        names = pins.get((r.run_id, r.kind.value, r.step), [])
        rows.append({"checkpoint": str(r), "run_id": r.run_id, "kind": r.kind.value, "step": r.step, "pins": names})
        lines.append(str(r) + (f"   pinned: {', '.join(names)}" if names else ""))
    emit(args, {"store": store.url, "checkpoints": rows}, "\n".join(lines) or "(no committed checkpoints)")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint on a held-out split; a test-split evaluation is an exposure, logged."""
    ref = _ref(args.checkpoint)
    if ref.kind != CheckpointKind.TRAINING:
        raise ConfigError("checkpoint.kind", expected="training", found=ref.kind.value)
    store = open_store(ref.store_url)
    given = load_config(args.config) if args.config else None
    trainer = load_trainer(given) if given is not None else None
    state, manifest, trainer = load_training_with_trainer(store, ref, trainer=trainer)
    metrics = trainer.evaluate(state, args.split)
    if metrics is None:
        raise ConfigError(
            "--split", expected=f"a split this run holds out (set data.{args.split}_fraction)", found=args.split
        )
    payload: dict[str, Any] = {"checkpoint": str(ref), "split": args.split, "step": state.step, **metrics}
    text = f"{args.split} at step {state.step}: loss {metrics['loss']:.6f}, accuracy {metrics['accuracy']:.4f}"
    if args.split == "test":
        count = record_test_exposure(store, ref, manifest.fingerprint, metrics, state.lineage)
        payload["final_test_exposures"] = count
        text += f"\nfinal-test exposures of this lineage: {count} (logged in {store.url}/{ref.run_id}/lifecycle/)"
        if count >= 2:
            payload["warning"] = "the final test split has been evaluated more than once"
            print(
                f"warning: the final test split has now been evaluated {count} times in this lineage; "
                "its score is no longer an unbiased estimate",
                file=sys.stderr,
            )
    emit(args, payload, text)
    return 0


def report_dir(out: str | None, run_id: str) -> Path:
    """Where a report goes: an existing or creatable directory, checked before any work."""
    path = Path(out or f"cairn-report-{run_id}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".cairn-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            "--out", expected="a directory that can be written", found=f"{path} ({exc.strerror})"
        ) from None
    return path


def cmd_report(args: argparse.Namespace) -> int:
    """A run's report from its store alone (no Temporal): loss, lr, commits, speed."""
    from cairn.runs.record import run_record
    from workers.reports.run import write_report

    run_id = _run_id_arg(args.run, "RUN")
    assert run_id is not None
    record = run_record(_store_arg(args.store, must_exist=True), run_id)
    result, text, files = write_report(record, report_dir(args.out, run_id))
    emit(args, {**result, "files": [str(f) for f in files]}, text)
    return 0


# -- parser -------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument(
        "--endpoint-url",
        help="S3 endpoint for s3:// stores (same as AWS_ENDPOINT_URL_S3; else boto3's chain)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CairnArgumentParser(prog="cairn", description="Durable, resumable ML training on Temporal.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train in-process, checkpointing to a store")
    _common(p)
    p.add_argument("--config", help="trainer config JSON (see examples/config.json)")
    p.add_argument(
        "--steps",
        type=_count,
        required=True,
        help="number of updates to run (from --resume's step, else from step 0; with --world-size and no "
        "--resume: from the run's latest checkpoint)",
    )
    p.add_argument("--store", required=True, help="directory or s3://bucket/prefix")
    p.add_argument("--checkpoint-every", type=_count, help="commit a checkpoint every K steps")
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
        type=_count,
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

    p = sub.add_parser("eval", help="evaluate a checkpoint on its validation or final test split")
    _common(p)
    p.add_argument("checkpoint")
    p.add_argument("--split", choices=["val", "test"], default="val")
    p.add_argument("--config", help="the run's config (trusts the trainer it names)")
    add_numerics_arg(p, "evaluates")
    p.set_defaults(handler=cmd_eval)

    ckpt = sub.add_parser("ckpt", help="inspect, verify, compare, list and collect checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True)
    p = ckpt_sub.add_parser("show", help="print a checkpoint's manifest")
    _common(p)
    p.add_argument("checkpoint")
    p.set_defaults(handler=cmd_ckpt_show)
    p = ckpt_sub.add_parser("verify", help="exit 0 only when intact and valid")
    _common(p)
    p.add_argument("checkpoint")
    p.add_argument("--config", help="the run's config (trusts the trainer it names)")
    p.add_argument(
        "--format-only",
        action="store_true",
        help="check integrity only (checksums, fingerprint, signature, finiteness), not the model or the data",
    )
    p.set_defaults(handler=cmd_ckpt_verify)
    p = ckpt_sub.add_parser("compare", help="compare two training states bit for bit")
    _common(p)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: bit for bit)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0: bit for bit)")
    p.add_argument("--config", help="the runs' config (trusts the trainer it names)")
    p.set_defaults(handler=cmd_ckpt_compare)
    p = ckpt_sub.add_parser("list", help="list committed checkpoints")
    _common(p)
    p.add_argument("store")
    p.add_argument("--run", help="only this run id")
    p.set_defaults(handler=cmd_ckpt_list)
    p = ckpt_sub.add_parser("gc", help="apply retention: keep the last N and pinned, delete the rest")
    _common(p)
    p.add_argument("store")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--keep-last", type=int, default=3, help="committed checkpoints to keep (default 3)")
    p.add_argument("--keep-every", type=int, help="also keep every M-th step")
    p.add_argument("--grace-seconds", type=float, default=3600.0, help="age before orphans are collected")
    p.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    p.set_defaults(handler=cmd_ckpt_gc)
    p = ckpt_sub.add_parser("pin", help="pin a checkpoint by name so gc keeps it")
    _common(p)
    p.add_argument("checkpoint")
    p.add_argument("--name", required=True)
    p.set_defaults(handler=cmd_ckpt_pin)
    p = ckpt_sub.add_parser("unpin", help="remove a named pin (gc may then collect the checkpoint)")
    _common(p)
    p.add_argument("store")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--name", required=True)
    p.set_defaults(handler=cmd_ckpt_unpin)

    p = sub.add_parser("report", help="PNG plots and a summary of a run from its store (no Temporal needed)")
    _common(p)
    p.add_argument("store")
    p.add_argument("run")
    p.add_argument("--out", metavar="DIR", help="where the PNGs go (default ./cairn-report-RUN)")
    p.set_defaults(handler=cmd_report)

    # Temporal-facing commands (worker, run, dev) live beside the worker they drive.
    from workers.cli import drill as drill_commands
    from workers.cli import run as run_commands
    from workers.stack import devstack

    run_commands.register(sub, _common)
    devstack.register(sub, _common)
    drill_commands.register(sub, _common)
    drill_commands.register_plan_interval(sub, _common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        sys.stderr.write(parser.format_usage())
        return report_error(argparse.Namespace(json="--json" in words, debug=False), exc)
    try:
        code = _dispatch(args, reexec=argv is None)
        sys.stdout.flush()
    except BrokenPipeError:
        # `cairn ... --json | head`: the reader left. Not an error worth a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    if getattr(args, "exit_hard", False) and argv is None:
        from workers.worker import exit_now

        exit_now(code)  # skip teardown: the Temporal client's threads (temporalio/sdk-python#300)
    return code


def report_error(args: argparse.Namespace, exc: CairnError) -> int:
    """One line on stderr; with --json also one JSON object on stdout. Returns the exit code."""
    if args.debug:
        traceback.print_exc()
    print(f"cairn: error: {exc.type_name}: {exc}", file=sys.stderr)
    if getattr(args, "json", False):
        error = {
            "type": exc.type_name,
            "message": str(exc),
            "field": exc.field,
            "expected": exc.expected,
            "found": exc.found,
            "retryable": exc.retryable,
            "exit_code": exc.exit_code,
        }
        print(to_json({"ok": False, "error": error}))
    return exc.exit_code


def _dispatch(args: argparse.Namespace, *, reexec: bool = False) -> int:
    if getattr(args, "endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint_url  # read by boto3 for every S3 client
    try:
        if getattr(args, "numerics", None):  # a command that computes: under its profile, or not at all
            enter_profile(args.numerics, reexec=reexec)
        code: int = args.handler(args)
        return code
    except CommandFailed as failed:
        return failed.code
    except CairnError as exc:
        return report_error(args, exc)
    except KeyboardInterrupt:
        note = getattr(args, "interrupt_note", None)
        what = note.format_map(vars(args)) if note else "interrupted"
        return report_error(args, CommandInterrupted(what))


if __name__ == "__main__":
    sys.exit(main())
