"""What counts as committed: the one rule that ``latest``, listing, retention and GC, ``cairn ckpt
list`` and ``cairn ckpt gc`` and the drills apply to whatever they find in a store.

A checkpoint (run, kind, step) is committed when the object at its manifest key is a manifest
Cairn committed there: read under the manifest bound, it parses (format, version, schema),
matches its location (run, kind, step), carries a valid signature when a signing key is
configured, and its layout and fingerprint check out (``read_manifest``, the root alone).

Anything else found at a manifest key — junk, a truncated or oversized file, another run's or
step's manifest, an unsigned or foreign-signed one on a signed run, a kind Cairn does not know —
is *foreign*: never counted as committed (never the latest, never among the checkpoints
retention keeps), never deleted automatically, and reported with the reason by ``cairn ckpt
list`` and ``cairn ckpt gc``. A store that cannot answer (``StorageError``) decides nothing: the
error is raised, so no caller acts on a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

from cairn.checkpoint.layout import parse_checkpoint_key
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import (
    CairnError,
    CheckpointError,
    CheckpointNotFoundError,
    InvalidObjectError,
    ManifestError,
    SignatureError,
)
from cairn.stores.base import Store
from cairn.stores.local import LocalStore
from cairn.stores.memory import MemoryStore

__all__ = [
    "Verdict",
    "ForeignKey",
    "judge",
    "manifest_candidates",
    "judge_each",
    "judge_all",
    "highest_verdict",
    "list_checkpoints",
]

_KINDS = {k.value: k for k in CheckpointKind}
BATCH = 32
"""Manifests judged (and held) at once by ``judge_each``."""


@dataclass(frozen=True)
class Verdict:
    """What the object at a checkpoint's manifest key is: its committed manifest, or why not."""

    ref: CheckpointRef
    manifest: Manifest | None
    """The manifest, when the checkpoint is committed."""
    refusal: CairnError | None
    """Why the object there is foreign (typed, one line), when it is not committed."""

    @property
    def committed(self) -> bool:
        return self.manifest is not None


@dataclass(frozen=True)
class ForeignKey:
    """An object at a manifest's place that names no checkpoint Cairn can hold (an unknown kind)."""

    key: str
    reason: str


def judge(store: Store, ref: CheckpointRef, options: CheckpointOptions | None = None) -> Verdict | None:
    """The verdict on ``ref``'s manifest; None when there is none (never written, or collected
    since it was listed). ``StorageError`` is raised: it decides nothing."""
    try:
        manifest = read_manifest(store, ref, expect_kind=None, options=resolve_options(options), expand_index=False)
    except CheckpointNotFoundError:
        return None
    except (CheckpointError, InvalidObjectError) as exc:
        return Verdict(ref, None, exc)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a check that met a shape it did not expect
        refusal = ManifestError(f"{ref}: not a manifest Cairn reads ({type(exc).__name__}: {exc})")
        return Verdict(ref, None, refusal)
    return Verdict(ref, manifest, None)


def manifest_candidates(
    store: Store,
    run_id: str | None = None,
    kind: CheckpointKind | None = None,
    *,
    start_after: str | None = None,
    prefix: str | None = None,
) -> tuple[list[CheckpointRef], list[ForeignKey]]:
    """Every object listed at a manifest key (of ``run_id`` and ``kind`` when given), as refs
    sorted by (run, kind, step) — unjudged — and those under a kind Cairn does not know."""
    if prefix is None:
        prefix = "" if run_id is None else f"{run_id}/" + ("" if kind is None else f"{kind.value}/")
    refs: list[CheckpointRef] = []
    unknown: list[ForeignKey] = []
    for info in store.list(prefix, start_after=start_after):
        key = parse_checkpoint_key(info.key)
        if key is None or not key.is_manifest or (run_id is not None and key.run_id != run_id):
            continue
        if key.kind not in _KINDS:
            unknown.append(ForeignKey(info.key, f"kind {key.kind!r} is not one of {sorted(_KINDS)}"))
            continue
        if kind is not None and key.kind != kind.value:
            continue
        refs.append(CheckpointRef(store.url, key.run_id, _KINDS[key.kind], key.step))
    refs.sort(key=lambda r: (r.run_id, r.kind.value, r.step))
    return refs, unknown


def judge_each(
    store: Store, refs: Iterable[CheckpointRef], options: CheckpointOptions | None = None, *, concurrent: bool = False
) -> Iterator[Verdict]:
    """The verdicts on ``refs`` (those whose manifest is gone are left out), in order, a batch
    at a time (at most ``BATCH`` manifests held at once, whatever the run holds); ``concurrent``:
    each batch read on threads (a remote store's latency, not the CPU, bounds it)."""
    options = resolve_options(options)
    refs = list(refs)
    with ThreadPoolExecutor(max_workers=16) if concurrent and len(refs) > 1 else nullcontext() as pool:
        for start in range(0, len(refs), BATCH):
            batch = refs[start : start + BATCH]
            found = (
                pool.map(lambda r: judge(store, r, options), batch)
                if pool
                else (judge(store, r, options) for r in batch)
            )
            yield from (v for v in found if v is not None)


def judge_all(
    store: Store, refs: Iterable[CheckpointRef], options: CheckpointOptions | None = None, *, concurrent: bool = False
) -> list[Verdict]:
    """``judge_each``, as a list."""
    return list(judge_each(store, refs, options, concurrent=concurrent))


def highest_verdict(
    store: Store,
    run_id: str,
    kind: CheckpointKind,
    options: CheckpointOptions,
    *,
    start_after: str | None = None,
) -> Verdict | None:
    """The verdict on the highest committed step of ``(run_id, kind)`` among the manifests
    listed (after ``start_after``), its manifest with it: candidates are judged from the highest
    step down, so a foreign object above the genuine latest costs one read and is passed over.
    When the run holds manifests and none is committed because no signature verifies (a rotated
    or wrong signing key), it raises ``SignatureError`` rather than answer None: a resume must
    never start such a run over."""
    refs, _ = manifest_candidates(store, run_id, kind, start_after=start_after)
    unverified: list[Verdict] = []
    for ref in reversed(refs):
        verdict = judge(store, ref, options)
        if verdict is not None and verdict.committed:
            return verdict
        if verdict is not None and isinstance(verdict.refusal, SignatureError):
            unverified.append(verdict)
    if unverified and start_after is None:
        # Checkpoints are there and none verifies with this key: never start the run over from step 0.
        raise SignatureError(
            f"run {run_id}: {len(unverified)} {kind.value} checkpoint(s) and none verifies with the configured "
            f"signing key (rotated or wrong key on this worker?); the newest: {unverified[0].refusal}",
            field="signature",
        )
    return None


def list_checkpoints(
    store: Store,
    run_id: str | None = None,
    kind: CheckpointKind | None = None,
    options: CheckpointOptions | None = None,
) -> list[CheckpointRef]:
    """Committed checkpoints, sorted by (run, kind, step): every manifest listed is judged by
    the one rule (``judge``); foreign objects at a manifest's key are left out (``cairn ckpt
    list`` shows them, with the reason)."""
    refs, _ = manifest_candidates(store, run_id, kind)
    concurrent = not isinstance(store, LocalStore | MemoryStore)  # a remote store: overlap the reads
    return [v.ref for v in judge_all(store, refs, options, concurrent=concurrent) if v.committed]
