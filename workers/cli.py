"""The ``cairn`` command line.

Exit codes: 0 success; 1 a checkpoint was refused, ``compare`` found differences, or a run
failed; 2 bad input (usage, config, reference); 3 storage failure; 4 an external effect failed;
5 Temporal unreachable or refused the request.
Errors print one line on stderr (``cairn: error: ...``); ``--debug`` adds the traceback.
``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from cairn.checkpoint import (
    CheckpointKind,
    CheckpointRef,
    list_checkpoints,
    load_training,
    read_manifest,
    read_tensors,
    signer_from_env,
)
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin
from cairn.config import load_config
from cairn.errors import (
    CairnError,
    CheckpointError,
    ConfigError,
    EffectError,
    StorageError,
)
from cairn.session import TrainingSession, default_run_id
from cairn.stores import open_store

Handler = Callable[[argparse.Namespace], int]


class CommandFailed(Exception):
    """A command's verdict is negative (e.g. compare found differences); already reported."""

    def __init__(self, code: int) -> None:
        self.code = code


def emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(payload, sort_keys=True, default=str))
    else:
        print(text)


def _ref(text: str) -> CheckpointRef:
    return CheckpointRef.parse(text)


# -- train ----------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    store = open_store(args.store)
    config = load_config(args.config) if args.config else None
    if args.resume:
        ref = _ref(args.resume)
        run_id = args.run_id or (f"{ref.run_id}-weights-only" if args.weights_only else ref.run_id)
        session = TrainingSession.from_checkpoint(
            ref, run_id=run_id, store=store, config=config, weights_only_restore=args.weights_only
        )
    else:
        if config is None:
            raise ConfigError("--config is required unless --resume is given")
        if args.weights_only:
            raise ConfigError("--weights-only only makes sense with --resume")
        session = TrainingSession.fresh(args.run_id or default_run_id(config), store, config)
    bar = tqdm(total=args.steps, desc=f"train {session.run_id}", unit="step", disable=None, leave=False)

    def on_step(state: Any) -> None:
        bar.update(1)
        if state.history["loss"]:
            bar.set_postfix(loss=f"{state.history['loss'][-1]:.4f}", refresh=False)

    started = time.perf_counter()
    try:
        result = session.run(args.steps, checkpoint_every=args.checkpoint_every, on_step=on_step)
    finally:
        bar.close()
    assert result is not None
    state = session.state
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
    }
    emit(args, payload, str(result.ref))
    return 0


# -- ckpt -------------------------------------------------------------------------------------
def cmd_ckpt_show(args: argparse.Namespace) -> int:
    ref = _ref(args.checkpoint)
    manifest = read_manifest(open_store(ref.store_url), ref, expect_kind=None)
    body = manifest.model_dump(mode="json")
    body["checkpoint"] = str(ref)
    if args.json:
        print(json.dumps(body, sort_keys=True))
        return 0
    lineage = manifest.lineage
    print(f"checkpoint   {ref}")
    print(f"kind         {manifest.kind.value}   format v{manifest.format_version}")
    print(f"run          {manifest.run_id}   step {manifest.step}   cursor {manifest.cursor}")
    print(f"fingerprint  {manifest.fingerprint}  (an identifier, not a signature)")
    print(f"signed       {'yes' if manifest.signature else 'no'}")
    print(f"bytes        {manifest.total_bytes} in {len(manifest.tensors)} tensors, {len(manifest.shards)} shards")
    if lineage is not None:
        print(f"dataset      {lineage.dataset_version} {lineage.dataset_hash}")
        print(f"model        {lineage.model_version}   tokenizer {lineage.tokenizer_version}")
        print(f"parent       {lineage.parent or '-'}")
        print(f"stage        {lineage.stage_contract}   final-test exposures {lineage.final_test_exposures}")
    for t in manifest.tensors:
        print(f"  {t.name:<24} {t.dtype} {t.shape!s:<14} {t.length:>12} B  {t.checksum[:19]}")
    return 0


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    ref = _ref(args.checkpoint)
    store = open_store(ref.store_url)
    if ref.kind == CheckpointKind.TRAINING:
        state, manifest = load_training(store, ref)
        detail = f"training state at step {state.step}, cursor {state.cursor}"
    else:
        manifest = read_manifest(store, ref, expect_kind=ref.kind, signer=signer_from_env())
        read_tensors(store, ref, manifest)
        detail = f"{ref.kind.value} checkpoint"
    emit(
        args,
        {"checkpoint": str(ref), "ok": True, "fingerprint": manifest.fingerprint, "step": manifest.step},
        f"ok: {ref} ({detail}; {manifest.total_bytes} bytes, every checksum verified)",
    )
    return 0


def cmd_ckpt_compare(args: argparse.Namespace) -> int:
    ref_a, ref_b = _ref(args.a), _ref(args.b)
    state_a, man_a = load_training(open_store(ref_a.store_url), ref_a)
    state_b, man_b = load_training(open_store(ref_b.store_url), ref_b)
    diffs = compare_states(state_a, state_b)
    payload = {
        "a": str(ref_a),
        "b": str(ref_b),
        "identical": not diffs,
        "fingerprints": [man_a.fingerprint, man_b.fingerprint],
        "differences": [d.to_json() for d in diffs],
    }
    if not diffs:
        emit(args, payload, "identical: theta, m, v, t, rng, cursor, history and config match bit for bit")
        return 0
    lines = [f"DIFFERENT: {len(diffs)} field(s) differ"]
    for d in diffs:
        extra = "" if d.max_abs_diff is None else f" (max abs diff {d.max_abs_diff:.6g})"
        lines.append(f"  {d.field}: {d.detail}{extra}")
    emit(args, payload, "\n".join(lines))
    raise CommandFailed(1)


def cmd_ckpt_gc(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    policy = RetentionPolicy(keep_last=args.keep_last, keep_every=args.keep_every, grace_seconds=args.grace_seconds)
    plan = collect_garbage(store, args.run, policy, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"keep   {r}" for r in plan.keep] + [f"{verb} {r}" for r in plan.delete]
    lines += [f"{verb} orphan {k}" for k in plan.orphans]
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


def cmd_ckpt_list(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    refs = list_checkpoints(store, args.run)
    rows = [{"checkpoint": str(r), "run_id": r.run_id, "kind": r.kind.value, "step": r.step} for r in refs]
    emit(
        args,
        {"store": store.url, "checkpoints": rows},
        "\n".join(str(r) for r in refs) or "(no committed checkpoints)",
    )
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
    parser = argparse.ArgumentParser(prog="cairn", description="Durable, resumable ML training on Temporal.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train in-process, checkpointing to a store")
    _common(p)
    p.add_argument("--config", help="trainer config JSON (see examples/config.json)")
    p.add_argument("--steps", type=int, required=True, help="number of updates to run")
    p.add_argument("--store", required=True, help="directory or s3://bucket/prefix")
    p.add_argument("--checkpoint-every", type=int, help="commit a checkpoint every K steps")
    p.add_argument("--resume", metavar="CKPT", help="checkpoint reference to resume from")
    p.add_argument("--weights-only", action="store_true", help="resume theta only (does NOT reproduce training)")
    p.add_argument("--run-id", help="run id (default: derived from the config, or the resumed run's)")
    p.set_defaults(handler=cmd_train)

    ckpt = sub.add_parser("ckpt", help="inspect, verify, compare, list and collect checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True)
    p = ckpt_sub.add_parser("show", help="print a checkpoint's manifest")
    _common(p)
    p.add_argument("checkpoint")
    p.set_defaults(handler=cmd_ckpt_show)
    p = ckpt_sub.add_parser("verify", help="exit 0 only when intact and valid")
    _common(p)
    p.add_argument("checkpoint")
    p.set_defaults(handler=cmd_ckpt_verify)
    p = ckpt_sub.add_parser("compare", help="compare two training states bit for bit")
    _common(p)
    p.add_argument("a")
    p.add_argument("b")
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

    # Temporal-facing commands (worker, run, dev) live beside the worker they drive.
    from workers import devstack, run_commands

    run_commands.register(sub, _common)
    devstack.register(sub, _common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code = _dispatch(args)
    if getattr(args, "exit_hard", False) and argv is None:
        # The Temporal client's native threads can abort CPython's finalization
        # (temporalio/sdk-python#300): a short-lived client command skips teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    if getattr(args, "endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint_url  # read by boto3 for every S3 client
    try:
        code: int = args.handler(args)
        return code
    except CommandFailed as failed:
        return failed.code
    except CairnError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"cairn: error: {exc.type_name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cairn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
