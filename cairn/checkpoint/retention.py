"""Retention: keep the last N committed checkpoints plus pinned ones; collect the rest.

Committed means what ``cairn.checkpoint.committed`` says, for every manifest listed: a foreign
object at a manifest's key (junk, truncated, oversized, another run's, unsigned on a signed run)
is never counted among the committed, kept or deleted — it is reported (``GcPlan.foreign``), and
while one is there no shard of its kind and no history segment is deleted. Pinned = every
``keep_every`` steps, or named with ``pin`` (an object ``RUN/pins/NAME`` holding the step; one
that is not a pin Cairn writes pins nothing and is reported too). Deleted: older unpinned
committed checkpoints (manifest first, so a checkpoint stops existing before its shards go),
uncommitted prefixes older than the grace period (crashed writers), shard files no manifest
refers to (losing racers), history segments (``RUN/history/``) no kept checkpoint refers to,
and incomplete multipart uploads under the run (writers killed mid-upload; S3 only), also only
after the grace period. Never deleted: the latest committed checkpoint, a segment a kept
checkpoint (or a pin) refers to — nor any segment while a foreign manifest is there — or
anything younger than the grace period (it
may be being written right now: a save writes its segments before its manifest).

Incremental checkpoints reference shards of earlier ones (``cairn.checkpoint.reuse``), so shard
files are reference-counted: a shard a kept checkpoint's root links (``IndexRef.linked``) is
never deleted, whichever checkpoint wrote it (a retired checkpoint's manifest goes, its linked
shards stay); while a foreign manifest of a kind is there, no shard of that kind is deleted;
and after uncommitting, the run's intents are listed (``cairn.checkpoint.intents``): nothing
under an attempt a live intent (younger than two grace periods) names is deleted, expired
intents are. The retired manifests are deleted first; every other deletion list is final before
its first delete (the intents only shrink them), so a pass killed at any point has deleted only
retired manifests and unreferenced objects.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from cairn.checkpoint.committed import judge_each
from cairn.checkpoint.history import history_ref_keys
from cairn.checkpoint.intents import intent_expired, live_intents
from cairn.checkpoint.layout import (
    MAX_PIN_BYTES,
    RUN_ID_PATTERN,
    STEP_DIGITS,
    history_prefix,
    linked_shard,
    manifest_key,
    parse_checkpoint_key,
    parse_history_segment_key,
    parse_intent_key,
    pin_key,
    pins_prefix,
    run_prefix,
)
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import CheckpointError, ConfigError, InvalidObjectError, ObjectNotFoundError
from cairn.stores.base import ObjectInfo, Store
from cairn.stores.local import LocalStore
from cairn.stores.memory import MemoryStore
from cairn.stores.objects import read_json_object

__all__ = ["RetentionPolicy", "GcPlan", "plan_gc", "collect_garbage", "pin", "unpin", "pinned_steps", "read_pins"]

_KINDS = {k.value: k for k in CheckpointKind}
_MAX_STEP = 10**STEP_DIGITS - 1
UNVERIFIED_NOTE = (
    "the run's checkpoints are signed and no signing key is configured here: nothing deleted (a forged unsigned "
    "manifest could pass as the latest); set CAIRN_SIGNING_KEY to collect"
)


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
    referenced: list[str] = field(default_factory=list)
    """Shards of retired checkpoints and orphans held back: a kept checkpoint links them, a
    live intent protects them, or a kept manifest of their kind cannot be read."""
    intents: list[str] = field(default_factory=list)
    """Expired intents (``cairn.checkpoint.intents``), deleted with the orphans."""
    notes: list[str] = field(default_factory=list)
    """Why the pass deleted less than its policy says (one line each)."""
    foreign: dict[str, str] = field(default_factory=dict)
    """Objects at a manifest's or a pin's key that Cairn did not commit there (key -> why, one
    line): never counted, kept or deleted; while one is there, its kind's shards and the run's
    history segments are held back (it might be a damaged checkpoint that references them)."""
    sizes: dict[str, int] = field(default_factory=dict, repr=False)
    """Every listed object's size, for ``deleted_bytes``."""

    def to_json(self) -> dict[str, object]:
        return {
            "keep": [str(r) for r in self.keep],
            "delete": [str(r) for r in self.delete],
            "orphans": self.orphans,
            "deleted_bytes": self.deleted_bytes,
            "aborted_uploads": self.aborted_uploads,
            "history_segments": len(self.segments),
            "referenced_shards": len(self.referenced),
            "foreign": [{"key": k, "reason": v} for k, v in sorted(self.foreign.items())],
            "notes": self.notes,
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
    """(kind, step) -> the names pinning it; pins that are not Cairn's are left out (``read_pins``)."""
    return read_pins(store, run_id)[0]


def read_pins(store: Store, run_id: str) -> tuple[dict[tuple[str, int], list[str]], dict[str, str]]:
    """The run's pins, read bounded (``MAX_PIN_BYTES``, parsed by the bounded JSON reader): (kind,
    step) -> names, and the pins that are not a pin Cairn writes (key -> why), which pin nothing."""
    pins: dict[tuple[str, int], list[str]] = defaultdict(list)
    foreign: dict[str, str] = {}
    for info in store.list(pins_prefix(run_id)):
        try:
            body = read_json_object(store, info.key, max_bytes=MAX_PIN_BYTES, what="pin")
        except ObjectNotFoundError:
            continue  # unpinned since it was listed
        except (CheckpointError, InvalidObjectError) as exc:
            foreign[info.key] = str(exc)
            continue
        kind, step = body.get("kind"), body.get("step")
        if not isinstance(kind, str) or kind not in _KINDS or type(step) is not int or not 0 <= step <= _MAX_STEP:
            foreign[info.key] = f"{info.key}: not a pin (expected {{kind, step}}, found {str(body)[:80]})"
            continue
        pins[(str(kind), step)].append(info.key.rsplit("/", 1)[-1].removesuffix(".json"))
    return pins, foreign


def plan_gc(
    store: Store,
    run_id: str,
    policy: RetentionPolicy,
    now: float | None = None,
    options: CheckpointOptions | None = None,
) -> GcPlan:
    """One listing of the run, one pass over it, each manifest read once: linear in the number
    of objects. Every manifest listed is judged by the one rule (``cairn.checkpoint.committed``;
    ``options``: whose signer applies); only committed checkpoints are counted, kept or deleted,
    and a foreign object at a manifest's key is left where it is, with its prefix, and reported."""
    now = time.time() if now is None else now
    options = resolve_options(options)
    by_prefix: dict[tuple[str, int], list[ObjectInfo]] = defaultdict(list)
    segments: list[ObjectInfo] = []
    expired: list[str] = []
    for info in store.list(run_prefix(run_id)):
        key = parse_checkpoint_key(info.key)
        if key is not None and key.run_id == run_id:
            by_prefix[(key.kind, key.step)].append(info)
        elif info.key.startswith(history_prefix(run_id)) and parse_history_segment_key(info.key) is not None:
            segments.append(info)
        elif parse_intent_key(info.key) is not None and intent_expired(info.mtime, policy.grace_seconds, now):
            expired.append(info.key)
    referenced: set[str] | None = set()  # None: a manifest is not Cairn's, so nothing is known
    linked: set[str] = set()  # shards kept roots reference
    unknown: set[str] = set()  # kinds with a foreign manifest: any shard may be referenced
    pins, bad_pins = read_pins(store, run_id)
    plan = GcPlan(intents=expired, foreign=dict(bad_pins))
    candidates: list[CheckpointRef] = []
    for (kind, step), objects in sorted(by_prefix.items()):
        mkey = manifest_key(run_id, kind, step)
        if not any(o.key == mkey for o in objects):
            if all(now - o.mtime > policy.grace_seconds for o in objects):
                plan.orphans += [o.key for o in objects]  # a crashed writer's uncommitted prefix
        elif kind in _KINDS:
            candidates.append(CheckpointRef(store.url, run_id, _KINDS[kind], step))
        else:
            plan.foreign[mkey] = f"{mkey}: kind {kind!r} is not one of {sorted(_KINDS)}"
            unknown.add(kind)
    committed: dict[str, dict[int, _Refs]] = defaultdict(dict)
    signed = False
    remote = not isinstance(store, LocalStore | MemoryStore)  # a remote store: overlap the reads
    for verdict in judge_each(store, candidates, options, concurrent=remote):  # each manifest read once
        kind = verdict.ref.kind.value
        if verdict.manifest is not None:  # only what GC needs of it is kept, not the manifest
            committed[kind][verdict.ref.step] = _Refs.of(verdict.manifest, verdict.ref)
            signed |= verdict.manifest.signature is not None
        else:  # foreign: left alone, and it holds back its kind's shards
            plan.foreign[manifest_key(run_id, kind, verdict.ref.step)] = str(verdict.refusal)
            unknown.add(kind)
    if unknown:
        referenced = None
    if signed and options.signer is None:
        plan.notes.append(UNVERIFIED_NOTE)
    for kind, manifests in committed.items():
        steps = sorted(manifests)
        keep = set(steps[-policy.keep_last :])
        keep |= {s for s in steps if policy.keep_every and s % policy.keep_every == 0}
        keep |= {s for s in steps if (kind, s) in pins}
        if signed and options.signer is None:
            keep = set(steps)  # signatures unverifiable here: a forged manifest could pass as the latest
        for step in steps:
            ref = CheckpointRef(store.url, run_id, _KINDS[kind], step)
            objects = by_prefix[(kind, step)]
            mkey = manifest_key(run_id, kind, step)
            if step in keep:
                plan.keep.append(ref)
                refs = manifests[step]
                plan.orphans += _unreferenced_shards(refs, objects, now, policy)
                linked.update(refs.linked)
                if referenced is not None:
                    referenced |= refs.history
            else:
                plan.delete.append(ref)
                plan.uncommit.append(mkey)
                plan.remove += [o.key for o in objects if o.key != mkey]
    if referenced is not None:
        doomed = [o for o in segments if o.key not in referenced and now - o.mtime > policy.grace_seconds]
        plan.segments = [o.key for o in doomed]
        plan.deleted_bytes += sum(o.size for o in doomed)
    _hold(plan, lambda key: key in linked or (_shard_kind(run_id, key) or "") in unknown)
    plan.sizes = {o.key: o.size for objects in by_prefix.values() for o in objects}
    plan.deleted_bytes += sum(plan.sizes.get(k, 0) for k in [*plan.uncommit, *plan.remove, *plan.orphans])
    return plan


def _shard_kind(run_id: str, key: str) -> str | None:
    """The kind of a key that names a shard file of this run (one a root may link), else None."""
    found = parse_checkpoint_key(key)
    if found is None or linked_shard(key, run_id, found.kind, None) is None:
        return None
    return found.kind


def _attempt_of(key: str) -> str | None:
    """``RUN/KIND/STEP/NONCE/`` of a key under a save attempt, else None."""
    found = parse_checkpoint_key(key)
    if found is None or "/" not in found.rest:
        return None
    return key[: len(key) - len(found.rest)] + found.rest.split("/", 1)[0] + "/"


def _hold(plan: GcPlan, held: Callable[[str], bool]) -> None:
    """Move the keys ``held`` names out of the deletion lists, into ``plan.referenced``."""
    for name in ("remove", "orphans"):
        keys: list[str] = getattr(plan, name)
        plan.referenced += [k for k in keys if held(k)]
        setattr(plan, name, [k for k in keys if not held(k)])


@dataclass(frozen=True)
class _Refs:
    """What GC needs of a committed manifest: the objects of its prefix it uses, the shards of
    other checkpoints it links, the history segments it refers to."""

    used: frozenset[str]
    attempt: str | None
    """v3: the committed attempt's prefix (its shards and rank indexes are all in use)."""
    linked: frozenset[str]
    history: frozenset[str]

    @classmethod
    def of(cls, manifest: Manifest, ref: CheckpointRef) -> _Refs:
        used = {f"{ref.prefix}/{s.key}" for s in manifest.shards} | {manifest_key(ref.run_id, ref.kind.value, ref.step)}
        return cls(
            used=frozenset(used),
            attempt=None if manifest.indexes is None else f"{ref.prefix}/{manifest.writer.nonce}/",
            linked=frozenset(k for r in manifest.indexes or [] for k in r.linked),
            history=frozenset()
            if manifest.history is None
            else frozenset(history_ref_keys(ref.run_id, manifest.history)),
        )


def _unreferenced_shards(refs: _Refs, objects: list[ObjectInfo], now: float, policy: RetentionPolicy) -> list[str]:
    return [
        o.key
        for o in objects
        if o.key not in refs.used
        and not (refs.attempt and o.key.startswith(refs.attempt))  # v3: the committed attempt's shards and indexes
        and now - o.mtime > policy.grace_seconds
    ]


def collect_garbage(
    store: Store,
    run_id: str,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
    now: float | None = None,
    options: CheckpointOptions | None = None,
) -> GcPlan:
    """Apply ``policy`` to a run: batched deletes (manifests first: a checkpoint stops existing
    before its shards go), then orphans, then stale incomplete uploads. Foreign objects
    (``GcPlan.foreign``) are reported, never deleted."""
    plan = plan_gc(store, run_id, policy, now, options)
    if not dry_run:
        store.delete(plan.uncommit)  # before the intents are listed: see cairn.checkpoint.intents
    if plan.remove or plan.orphans:
        intents = live_intents(store, run_id, policy.grace_seconds, time.time() if now is None else now)
        before = len(plan.referenced)
        _hold(plan, lambda key: _attempt_of(key) in intents.protected)
        plan.deleted_bytes -= sum(plan.sizes.get(k, 0) for k in plan.referenced[before:])
        plan.intents = sorted({*plan.intents, *intents.expired})
    if dry_run:
        plan.aborted_uploads = store.stale_uploads(run_prefix(run_id), policy.grace_seconds, now=now)
        return plan
    store.delete(plan.remove)
    store.delete([*plan.orphans, *plan.intents])
    if plan.segments:  # last: what a kept checkpoint refers to is never among them
        store.delete(plan.segments)
    plan.aborted_uploads = store.abort_stale_uploads(run_prefix(run_id), policy.grace_seconds, now=now)
    return plan
