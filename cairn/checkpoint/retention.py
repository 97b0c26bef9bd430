"""Retention: keep the last N committed checkpoints plus pinned ones; collect the rest.

Pinned = every ``keep_every`` steps, or named with ``pin`` (an object ``RUN/pins/NAME``
holding the step). Deleted: older unpinned committed checkpoints (manifest first, so a
checkpoint stops existing before its shards go), uncommitted prefixes older than the grace
period (crashed writers), shard files no manifest refers to (losing racers), history segments
(``RUN/history/``) no kept checkpoint refers to, and incomplete multipart uploads under the run
(writers killed mid-upload; S3 only), also only after the grace period. Never deleted: the
latest committed checkpoint, a segment a kept checkpoint (or a pin) refers to — nor any
segment while a kept manifest cannot be read — or anything younger than the grace period (it
may be being written right now: a save writes its segments before its manifest).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from cairn.checkpoint.history import history_ref_keys
from cairn.checkpoint.layout import (
    MANIFEST_NAME,
    RUN_ID_PATTERN,
    history_prefix,
    parse_checkpoint_key,
    parse_history_segment_key,
    pin_key,
    pins_prefix,
    run_prefix,
)
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.reader import parse_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import CheckpointError, ConfigError, InvalidObjectError
from cairn.stores.base import ObjectInfo, Store

__all__ = ["RetentionPolicy", "GcPlan", "plan_gc", "collect_garbage", "pin", "unpin", "pinned_steps"]


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 3
    keep_every: int | None = None
    grace_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ConfigError("retention.keep_last", expected=">= 1 (the latest is always kept)", found=self.keep_last)
        if self.keep_every is not None and self.keep_every < 1:
            raise ConfigError("retention.keep_every", expected=">= 1", found=self.keep_every)
        if not math.isfinite(self.grace_seconds) or self.grace_seconds < 0:
            # a shard younger than the grace period may be being written right now
            raise ConfigError("retention.grace_seconds", expected="a finite number >= 0", found=self.grace_seconds)


@dataclass
class GcPlan:
    keep: list[CheckpointRef] = field(default_factory=list)
    delete: list[CheckpointRef] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    """Object keys of uncommitted prefixes and unreferenced shards past the grace period."""
    deleted_bytes: int = 0
    aborted_uploads: list[str] = field(default_factory=list)
    """Keys of incomplete multipart uploads past the grace period (aborted, or to abort)."""
    uncommit: list[str] = field(default_factory=list, repr=False)
    """Manifests of the checkpoints in ``delete``: removed first, so each stops existing."""
    remove: list[str] = field(default_factory=list, repr=False)
    """Every other object of the checkpoints in ``delete``, removed after."""
    segments: list[str] = field(default_factory=list)
    """History segments no kept checkpoint refers to, past the grace period (removed last)."""

    def to_json(self) -> dict[str, object]:
        return {
            "keep": [str(r) for r in self.keep],
            "delete": [str(r) for r in self.delete],
            "orphans": self.orphans,
            "deleted_bytes": self.deleted_bytes,
            "aborted_uploads": self.aborted_uploads,
            "history_segments": len(self.segments),
        }


def pin(store: Store, ref: CheckpointRef, name: str) -> None:
    """Pin a committed checkpoint under ``name`` so retention never collects it."""
    if not RUN_ID_PATTERN.match(name):
        raise ConfigError("pin name", expected=RUN_ID_PATTERN.pattern, found=name)
    body = json.dumps({"kind": ref.kind.value, "step": ref.step}).encode()
    store.write_object(pin_key(ref.run_id, name), [body], size=len(body))


def unpin(store: Store, run_id: str, name: str) -> None:
    """Remove the pin ``name`` of ``run_id``; a missing pin is a ``ConfigError``."""
    if not RUN_ID_PATTERN.match(name):
        raise ConfigError("--name", expected=RUN_ID_PATTERN.pattern, found=name)
    key = pin_key(run_id, name)
    if not store.exists(key):
        raise ConfigError("--name", expected=f"a pin of run {run_id}", found=name)
    store.delete([key])


def pinned_steps(store: Store, run_id: str) -> dict[tuple[str, int], list[str]]:
    pins: dict[tuple[str, int], list[str]] = defaultdict(list)
    for info in store.list(pins_prefix(run_id)):
        try:
            body = json.loads(store.read(info.key))
            pins[(str(body["kind"]), int(body["step"]))].append(info.key.rsplit("/", 1)[-1].removesuffix(".json"))
        except (ValueError, KeyError, TypeError):
            continue
    return pins


def plan_gc(store: Store, run_id: str, policy: RetentionPolicy, now: float | None = None) -> GcPlan:
    """One listing of the run, one pass over it: linear in the number of objects. Manifests
    are read only for the checkpoints kept (to find shards no manifest refers to)."""
    now = time.time() if now is None else now
    by_prefix: dict[tuple[str, int], list[ObjectInfo]] = defaultdict(list)
    segments: list[ObjectInfo] = []
    for info in store.list(run_prefix(run_id)):
        key = parse_checkpoint_key(info.key)
        if key is not None and key.run_id == run_id:
            by_prefix[(key.kind, key.step)].append(info)
        elif info.key.startswith(history_prefix(run_id)) and parse_history_segment_key(info.key) is not None:
            segments.append(info)
    referenced: set[str] | None = set()  # None: a kept manifest is unreadable, so nothing is known
    pins = pinned_steps(store, run_id)
    plan = GcPlan()
    committed: dict[str, list[int]] = defaultdict(list)
    for (kind, step), objects in by_prefix.items():
        if any(o.key.endswith("/" + MANIFEST_NAME) for o in objects):  # committed
            committed[kind].append(step)
        elif all(now - o.mtime > policy.grace_seconds for o in objects):
            plan.orphans += [o.key for o in objects]  # a crashed writer's uncommitted prefix
    for kind, steps in committed.items():
        steps.sort()
        keep = set(steps[-policy.keep_last :])
        keep |= {s for s in steps if policy.keep_every and s % policy.keep_every == 0}
        keep |= {s for s in steps if (kind, s) in pins}
        for step in steps:
            ref = CheckpointRef(store.url, run_id, CheckpointKind(kind), step)
            objects = by_prefix[(kind, step)]
            if step in keep:
                plan.keep.append(ref)
                manifest = _kept_manifest(store, ref)
                plan.orphans += _unreferenced_shards(manifest, ref, objects, now, policy)
                if manifest is None or referenced is None:
                    referenced = None
                elif manifest.history is not None:
                    referenced |= history_ref_keys(run_id, manifest.history)
            else:
                plan.delete.append(ref)
                plan.uncommit += [o.key for o in objects if o.key.endswith("/" + MANIFEST_NAME)]
                plan.remove += [o.key for o in objects if not o.key.endswith("/" + MANIFEST_NAME)]
    if referenced is not None:
        doomed = [o for o in segments if o.key not in referenced and now - o.mtime > policy.grace_seconds]
        plan.segments = [o.key for o in doomed]
        plan.deleted_bytes += sum(o.size for o in doomed)
    orphans = set(plan.orphans)
    deleted = {(r.kind.value, r.step) for r in plan.delete}
    plan.deleted_bytes += sum(
        o.size for prefix, objects in by_prefix.items() for o in objects if prefix in deleted or o.key in orphans
    )
    return plan


def _kept_manifest(store: Store, ref: CheckpointRef) -> Manifest | None:
    """A kept checkpoint's manifest, or None when it cannot be read (for ``verify`` to report,
    not for GC to act on)."""
    try:
        return parse_manifest(store.read(f"{ref.prefix}/{MANIFEST_NAME}"), str(ref))
    except (CheckpointError, InvalidObjectError):
        return None


def _unreferenced_shards(
    manifest: Manifest | None, ref: CheckpointRef, objects: list[ObjectInfo], now: float, policy: RetentionPolicy
) -> list[str]:
    if manifest is None:
        return []  # an unreadable manifest is for `verify` to report, not for GC to act on
    used = {f"{ref.prefix}/{s.key}" for s in manifest.shards} | {f"{ref.prefix}/{MANIFEST_NAME}"}
    committed = None if manifest.indexes is None else f"{ref.prefix}/{manifest.writer.nonce}/"
    return [
        o.key
        for o in objects
        if o.key not in used
        and not (committed and o.key.startswith(committed))  # v3: the committed attempt's shards and indexes
        and now - o.mtime > policy.grace_seconds
    ]


def collect_garbage(
    store: Store, run_id: str, policy: RetentionPolicy, *, dry_run: bool = False, now: float | None = None
) -> GcPlan:
    """Apply ``policy`` to a run: batched deletes (manifests first: a checkpoint stops existing
    before its shards go), then orphans, then stale incomplete uploads."""
    plan = plan_gc(store, run_id, policy, now)
    if dry_run:
        plan.aborted_uploads = store.stale_uploads(run_prefix(run_id), policy.grace_seconds, now=now)
        return plan
    store.delete(plan.uncommit)
    store.delete(plan.remove)
    store.delete(plan.orphans)
    if plan.segments:  # last: what a kept checkpoint refers to is never among them
        store.delete(plan.segments)
    plan.aborted_uploads = store.abort_stale_uploads(run_prefix(run_id), policy.grace_seconds, now=now)
    return plan
