"""``cairn ckpt``: a checkpoint's manifest (show), its integrity and validity (verify), two
training states bit for bit (compare), its weights as safetensors (export, in ``ckpt_export``),
a standalone copy in another store (copy, in ``ckpt_copy``), and a store's checkpoints (list,
gc, pin, unpin)."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime
from typing import Any

from cairn.checkpoint import (
    CheckpointKind,
    CheckpointOptions,
    CheckpointRef,
    Manifest,
    RetentionPolicy,
    Verdict,
    collect_garbage,
    compare_states,
    exposure_count,
    judge_all,
    manifest_candidates,
    manifest_config,
    pin,
    pinned_steps,
    read_manifest,
    referenced_of,
    unpin,
    verify_history,
    verify_tensors,
)
from cairn.config import BUILTIN_TRAINER, TrainConfig, load_config
from cairn.errors import ConfigError
from cairn.models import load_checkpoint
from cairn.numerics import NumericsRecord
from cairn.state import TrainState
from cairn.stores import LocalStore, MemoryStore, open_store
from cairn.trainers import Trainer, check_finite, check_training_manifest, trainer_for_checkpoint
from workers.cli.args import Common, run_id_arg, store_arg
from workers.cli.ckpt_copy import add_copy_parser
from workers.cli.ckpt_export import add_export_parser
from workers.cli.output import CommandFailed, emit, to_json
from workers.cli.table import table

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    ckpt = sub.add_parser("ckpt", help="inspect, verify, compare, list and collect checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True)
    p = ckpt_sub.add_parser("show", help="print a checkpoint's manifest")
    common(p)
    p.add_argument("checkpoint")
    p.set_defaults(handler=cmd_ckpt_show)
    p = ckpt_sub.add_parser("verify", help="exit 0 only when intact and valid")
    common(p)
    p.add_argument("checkpoint")
    p.add_argument("--config", help="the run's config: builds the trainer; the checkpoint must match it")
    p.add_argument(
        "--format-only",
        action="store_true",
        help="check integrity only (checksums, fingerprint, signature, finiteness), not the model or the data",
    )
    p.set_defaults(handler=cmd_ckpt_verify)
    p = ckpt_sub.add_parser("compare", help="compare two training states bit for bit")
    common(p)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: bit for bit)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0: bit for bit)")
    p.add_argument("--config", help="the runs' config: builds the trainer; both checkpoints must match it")
    p.set_defaults(handler=cmd_ckpt_compare)
    add_export_parser(ckpt_sub, common)
    add_copy_parser(ckpt_sub, common)
    p = ckpt_sub.add_parser("list", help="list committed checkpoints")
    common(p)
    p.add_argument("store")
    p.add_argument("--run", help="only this run id")
    p.set_defaults(handler=cmd_ckpt_list)
    p = ckpt_sub.add_parser("gc", help="apply retention: keep the last N and pinned, delete the rest")
    common(p)
    p.add_argument("store")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--keep-last", type=int, default=3, help="committed checkpoints to keep (default 3)")
    p.add_argument("--keep-every", type=int, help="also keep every M-th step")
    p.add_argument("--grace-seconds", type=float, default=3600.0, help="age before orphans are collected")
    p.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    p.set_defaults(handler=cmd_ckpt_gc)
    p = ckpt_sub.add_parser("pin", help="pin a checkpoint by name so gc keeps it")
    common(p)
    p.add_argument("checkpoint")
    p.add_argument("--name", required=True)
    p.set_defaults(handler=cmd_ckpt_pin)
    p = ckpt_sub.add_parser("unpin", help="remove a named pin (gc may then collect the checkpoint)")
    common(p)
    p.add_argument("store")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--name", required=True)
    p.set_defaults(handler=cmd_ckpt_unpin)


def cmd_ckpt_show(args: argparse.Namespace) -> int:
    ref = CheckpointRef.parse(args.checkpoint)
    store = open_store(ref.store_url)
    root = read_manifest(store, ref, expect_kind=None, expand_index=False)
    manifest = read_manifest(store, ref, expect_kind=None) if root.indexes is not None else root
    body = root.model_dump(mode="json")  # as committed (a v3 root lists its rank indexes, not its blocks)
    body["checkpoint"] = str(ref)
    lineage = manifest.lineage
    exposures = exposure_count(store, ref.run_id, lineage) if ref.kind == CheckpointKind.TRAINING else 0
    body["final_test_exposures"] = exposures
    reuse = referenced_of(manifest)
    body["written_bytes"], body["referenced_bytes"] = reuse.written_bytes, reuse.referenced_bytes
    body["tokenizer"] = tokenizer = _tokenizer(manifest)
    encoded = [t for t in manifest.tensors if t.encoding is not None]
    body["stored_bytes"] = stored = sum(t.stored_length for t in manifest.tensors)  # what the entries take
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
            + ("" if manifest.indexes is None else f", {len(manifest.indexes)} rank indexes")
        )
    print(f"written by   {manifest.writer.ranks} rank(s)")
    if encoded:  # compressed (checkpoint.compression): the bytes above are logical
        print(
            f"stored       {stored} bytes ({manifest.total_bytes / max(1, stored):.2f}x smaller): "
            f"{len(encoded)} of {len(manifest.tensors)} entries compressed ({encoded[0].encoding.codec})"  # type: ignore[union-attr]
        )
    if reuse.shards:  # only a checkpoint that references something (JSON always has both fields)
        at = ", ".join(str(s) for s in reuse.steps)
        print(
            f"incremental  wrote {reuse.written_bytes} bytes, references {reuse.referenced_bytes} bytes "
            f"in {reuse.shards} shard(s) of other checkpoints of the run (steps {at})"
        )
    if lineage is not None:
        print(f"dataset      {lineage.dataset_version} {lineage.dataset_hash}")
        print(f"model        {lineage.model_version}   tokenizer {tokenizer}")
        print(f"parent       {lineage.parent or '-'}")
        print(f"trainer      {lineage.trainer or BUILTIN_TRAINER}   contract {lineage.reproducibility or 'bit-exact'}")
        if lineage.model_hash:
            print(f"architecture {lineage.model_hash}")
        print(f"numerics     {_numerics_line(lineage.numerics)}")
        print(f"stage        {lineage.stage_contract}   final-test exposures {exposures}")
        if lineage.reference is not None:
            r = lineage.reference
            print(
                f"reference    {r.checkpoint} ({r.fingerprint[:19]}...)   may change: {', '.join(r.may_change) or '-'}"
            )
        if exposures >= 2:
            print(
                f"warning: the final test split has been evaluated {exposures} times in this lineage; "
                "its score is no longer an unbiased estimate",
                file=sys.stderr,
            )
    rows = [(t.name, t.dtype, str(t.shape), t.length, t.checksum[:19]) for t in manifest.tensors]
    for line in table(("tensor", "dtype", "shape", "bytes", "checksum"), rows, indent="  "):
        print(line)
    return 0


def _tokenizer(manifest: Manifest) -> str:
    """The run's tokenizer, as ``ckpt show`` names it: the config's ``tokenizer_version``; else,
    for a trainer that trains its own on the run's data (options with a ``vocab_size``, as
    ``HFCausalLM``), its size and that data; else ``none``."""
    config, lineage = manifest.config or {}, manifest.lineage
    declared = lineage.tokenizer_version if lineage is not None else config.get("tokenizer_version", "none")
    options = (config.get("trainer") or {}).get("options") or {}
    vocab = options.get("vocab_size") if isinstance(options, dict) else None
    if declared != "none" or lineage is None or not isinstance(vocab, int) or isinstance(vocab, bool):
        return str(declared)
    return f"trained on the run's data: {vocab} tokens ({lineage.dataset_version}, {lineage.dataset_hash[:19]}...)"


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
    ref = CheckpointRef.parse(args.checkpoint)
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
        if manifest.history is not None:  # the history's segments, one at a time
            check = check_finite if trainer is None else trainer.check_values
            verify_history(store, ref.run_id, manifest.history, value_check=check)
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
    """The trainer that checks a checkpoint against its model (built from ``--config`` when
    given: ``trainer_for_checkpoint``); when its package or its data is not on this machine, say
    so (exit 2) and point at ``--format-only``: a verify that could not check the model must not
    exit 0."""
    try:
        return trainer_for_checkpoint(found, given, on_host=True)
    except ConfigError as exc:
        if "is not installed" in str(exc) or "data.path" in str(exc) or "dataset file" in str(exc):
            raise ConfigError(
                f"{exc} — the model and data cannot be checked on this machine; "
                "`cairn ckpt verify --format-only` checks integrity alone"
            ) from None
        raise


def _load_on_host(ref: CheckpointRef, given: TrainConfig | None) -> tuple[TrainState, Manifest]:
    """``load_training`` with a trainer built on the host (a GPU run's checkpoint compares on a
    machine without a GPU): from the run's config, else the checkpoint's under the trust rule."""
    loaded = load_checkpoint(ref, given)
    return loaded.state, loaded.manifest


def cmd_ckpt_compare(args: argparse.Namespace) -> int:
    ref_a, ref_b = CheckpointRef.parse(args.a), CheckpointRef.parse(args.b)
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ConfigError(flag, expected="a number in [0, 1]", found=value)
    given = load_config(args.config) if args.config else None
    state_a, man_a = _load_on_host(ref_a, given)
    state_b, man_b = _load_on_host(ref_b, given)
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
    run_id = run_id_arg(args.run, "--run")
    assert run_id is not None
    store = store_arg(args.store, must_exist=True)
    if not any(True for _ in store.list(f"{run_id}/")):
        raise ConfigError("--run", expected=f"a run with objects in {store.url}", found=run_id)
    policy = RetentionPolicy(keep_last=args.keep_last, keep_every=args.keep_every, grace_seconds=args.grace_seconds)
    plan = collect_garbage(store, run_id, policy, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"keep   {r}" for r in plan.keep] + [f"{verb} {r}" for r in plan.delete]
    lines += [f"{verb} orphan {k}" for k in plan.orphans]
    lines += [f"kept   {k} (referenced)" for k in plan.referenced]
    lines += [f"{'would abort' if args.dry_run else 'aborted'} incomplete upload {k}" for k in plan.aborted_uploads]
    lines.append(
        f"{verb} {len(plan.delete)} checkpoint(s), {len(plan.orphans)} orphan object(s), {plan.deleted_bytes} bytes"
    )
    emit(args, {"dry_run": args.dry_run, **plan.to_json()}, "\n".join(lines))
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    for key, why in sorted(plan.foreign.items())[:3]:
        print(f"warning: foreign: {key}: {why}", file=sys.stderr)
    if plan.foreign:
        print(
            f"warning: {len(plan.foreign)} object(s) at a manifest's or a pin's key are not Cairn's: left in place, "
            "not counted among the kept; their kind's shards are held until they are removed by hand",
            file=sys.stderr,
        )
    return 0


def cmd_ckpt_pin(args: argparse.Namespace) -> int:
    ref = CheckpointRef.parse(args.checkpoint)
    store = open_store(ref.store_url)
    read_manifest(store, ref, expect_kind=None, expand_index=False)  # only committed checkpoints can be pinned
    pin(store, ref, args.name)
    emit(args, {"checkpoint": str(ref), "pin": args.name}, f"pinned {ref} as {args.name!r}")
    return 0


def cmd_ckpt_unpin(args: argparse.Namespace) -> int:
    run_id = run_id_arg(args.run, "--run")
    assert run_id is not None
    store = store_arg(args.store, must_exist=True)
    unpin(store, run_id, args.name)
    emit(args, {"store": store.url, "run_id": run_id, "unpinned": args.name}, f"unpinned {args.name!r} of {run_id}")
    return 0


def cmd_ckpt_list(args: argparse.Namespace) -> int:
    """One row per object at a manifest's key, judged by the one rule of what is committed
    (``cairn.checkpoint.committed``, read concurrently from a remote store: 10,000 manifests are
    not 10,000 round trips in a row): a committed checkpoint's row says what its manifest says; a
    foreign object's row says why it is not a checkpoint (never the latest, never collected)."""
    run_id = run_id_arg(args.run, "--run")
    store = store_arg(args.store, must_exist=True)
    refs, unknown = manifest_candidates(store, run_id)
    options = CheckpointOptions.from_env()  # once: the signer applies to every manifest read
    remote = not isinstance(store, LocalStore | MemoryStore)  # local: CPU-bound, threads only contend for the GIL
    verdicts = judge_all(store, refs, options, concurrent=remote)
    if run_id is not None and not any(v.committed for v in verdicts):
        raise ConfigError("--run", expected=f"a run with committed checkpoints in {store.url}", found=run_id)
    pins: dict[tuple[str, str, int], list[str]] = {}
    for run in sorted({v.ref.run_id for v in verdicts}):
        for (kind, step), names in pinned_steps(store, run).items():
            pins[(run, kind, step)] = sorted(names)
    rows = [_listing_row(v, pins.get((v.ref.run_id, v.ref.kind.value, v.ref.step), [])) for v in verdicts]
    foreign = [r for r in rows if r["error"]] + [{"checkpoint": u.key, "error": u.reason} for u in unknown]
    if args.json:
        print(to_json({"store": store.url, "checkpoints": rows, "foreign": [f["checkpoint"] for f in foreign]}))
    else:
        print("\n".join(_listing_lines(rows)))
    for r in foreign[:3]:
        print(f"warning: foreign: {r['checkpoint']}: {r['error']}", file=sys.stderr)
    if foreign:
        more = f" ({len(foreign) - 3} more not shown)" if len(foreign) > 3 else ""
        print(
            f"warning: {len(foreign)} object(s) at a manifest's key are not checkpoints Cairn committed{more}: "
            "never resumed from, counted or collected; `cairn ckpt verify` says why, delete them by hand",
            file=sys.stderr,
        )
    return 0


def _listing_row(verdict: Verdict, pins: list[str]) -> dict[str, Any]:
    """A row of ``ckpt list`` (its JSON): what a committed manifest says, or why the object is foreign."""
    ref, manifest = verdict.ref, verdict.manifest
    row: dict[str, Any] = {"checkpoint": str(ref), "run_id": ref.run_id, "kind": ref.kind.value, "step": ref.step}
    row["committed"] = manifest is not None
    if manifest is not None:
        row |= {
            "committed_at": manifest.writer.created_at or None,
            "bytes": manifest.total_bytes,
            "format_version": manifest.format_version,
            "world_size": manifest.writer.ranks,
            "error": None,
        }
    else:
        row |= dict.fromkeys(("committed_at", "bytes", "format_version", "world_size"))
        assert verdict.refusal is not None
        row["error"] = f"{verdict.refusal.type_name}: {verdict.refusal}"
    row["pins"] = pins
    return row


def _listing_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(no committed checkpoints)"]
    several_runs = len({r["run_id"] for r in rows}) > 1
    headers = ["step", "kind", "committed at (UTC)", "bytes", "format", "world size", "pins", "checkpoint"]
    cells = [
        [
            r["step"],
            r["kind"],
            _when(r["committed_at"]) if not r["error"] else "(foreign)",
            None if r["bytes"] is None else f"{r['bytes']:,}",
            None if r["format_version"] is None else f"v{r['format_version']}",
            r["world_size"],
            ", ".join(r["pins"]) or None,
            r["checkpoint"],
        ]
        for r in rows
    ]
    right = {3}
    if several_runs:
        headers.insert(0, "run")
        for row, r in zip(cells, rows, strict=True):
            row.insert(0, r["run_id"])
        right = {4}
    lines = table(headers, cells, right=right)
    total = sum(r["bytes"] or 0 for r in rows)
    foreign = sum(1 for r in rows if r["error"])
    summary = f"{len(rows) - foreign} checkpoint(s), {total:,} bytes"
    summary += f", {foreign} foreign object(s)" if foreign else ""
    pinned = [
        f"{', '.join(r['pins'])} ({r['run_id'] + ' ' if several_runs else ''}{r['kind']} step {r['step']})"
        for r in rows
        if r["pins"]
    ]
    if pinned:
        summary += f"; pinned: {'; '.join(pinned)}"
    return [*lines, summary]


def _when(iso: str | None) -> str | None:
    """A commit time for humans: UTC to the second (the manifest keeps milliseconds)."""
    if not iso:
        return None
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")
