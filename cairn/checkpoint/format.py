"""Arrays <-> bytes: shard files, the tensor index, and the commit.

Tensors are raw C-order little-endian bytes packed into shard files; the manifest's index
gives each tensor's shard, offset, length and sha256. Nothing on the load path unpickles:
arrays are allocated from (dtype, shape) after every declared size has been checked, then
filled by ranged reads.

Write order (see ``cairn.stores.base``): shards first, concurrently, each hashed while it
streams out; then the manifest by create-if-absent, which is the commit. A writer that finds
the manifest already committed compares fingerprints: equal is success without rewriting,
different is ``CheckpointConflictError``. Content the reader would refuse (NaN or infinity,
integers over 64 digits, nesting over 64 levels, lone surrogates) is refused before any byte
is written, so every commit that succeeds can be read back to the same fingerprint.

Read bounds (``Limits``), all checked from the manifest alone, before any tensor is
allocated: manifest bytes, tensor count, total bytes, dimensions per tensor, each dimension
<= ``MAX_DIM`` (2**40) and each tensor's bytes <= ``max_total_bytes`` (Python integers, so
nothing overflows). ``verify_tensors`` checks a checkpoint of any size in one reusable buffer.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from blake3 import blake3
from pydantic import ValidationError

from cairn.bounded_json import JsonLimits, parse_json
from cairn.checkpoint.manifest import (
    CHECKSUM_PREFIX,
    FORMAT_NAME,
    MANIFEST_NAME,
    SUPPORTED_VERSIONS,
    CheckpointKind,
    Manifest,
    ShardEntry,
    TensorEntry,
    WriterInfo,
    compute_fingerprint,
    manifest_key,
    non_finite_path,
)
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.signing import Signer
from cairn.errors import (
    CheckpointConflictError,
    CheckpointNotFoundError,
    FormatVersionError,
    IntegrityError,
    InvariantError,
    KindMismatchError,
    ManifestError,
    ObjectNotFoundError,
    SizeLimitError,
    TensorSpecError,
)
from cairn.state import Lineage
from cairn.stores.base import Store

__all__ = [
    "Limits",
    "DEFAULT_LIMITS",
    "CheckpointContent",
    "CommitResult",
    "write_checkpoint",
    "write_shards",
    "commit_manifest",
    "new_save_nonce",
    "RankShards",
    "parse_manifest",
    "read_manifest",
    "read_tensors",
    "verify_tensors",
    "tensor_checksum",
    "ALLOWED_DTYPES",
    "MAX_DIM",
]

ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "|u1", "|b1"})
HASH_CHUNK = 8 << 20
CHECK_CHUNK = 1 << 20  # verify in cache-sized chunks
MAX_DIM = 1 << 40
"""No single dimension of a tensor may exceed this, even when another dimension is 0."""


@dataclass(frozen=True)
class Limits:
    """Bounds checked before anything is allocated (see the module docstring)."""

    max_manifest_bytes: int = 16 << 20
    max_tensors: int = 4096
    max_total_bytes: int = 64 << 30
    max_ndim: int = 8


DEFAULT_LIMITS = Limits()


@dataclass
class CheckpointContent:
    """Everything in a checkpoint except its tensors and layout."""

    kind: CheckpointKind
    run_id: str
    step: int
    cursor: int = 0
    config: dict[str, Any] | None = None
    lineage: Lineage | None = None
    rng: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self, tensors: list[tuple[str, str, list[int], str]]) -> str:
        return compute_fingerprint(
            kind=self.kind,
            step=self.step,
            cursor=self.cursor,
            config=self.config,
            lineage=self.lineage,
            rng=self.rng,
            meta=self.meta,
            tensors=tensors,
        )


@dataclass(frozen=True)
class CommitResult:
    ref: CheckpointRef
    manifest: Manifest
    created: bool
    """False when an identical checkpoint was already committed under the same key."""


def _as_le_contiguous(arr: np.ndarray) -> np.ndarray:
    out = arr if arr.flags.c_contiguous else arr.copy(order="C")  # keeps 0-d arrays 0-d
    if out.dtype.byteorder == ">":
        out = out.astype(out.dtype.newbyteorder("<"))
    if out.dtype.str not in ALLOWED_DTYPES:
        raise TensorSpecError(field="dtype", expected=sorted(ALLOWED_DTYPES), found=out.dtype.str)
    return out


def _byte_view(arr: np.ndarray) -> memoryview:
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer


def tensor_checksum(arr: np.ndarray) -> str:
    """BLAKE3 of the tensor's bytes: cryptographic (so a signed manifest covers the data) and
    several times faster than sha256, which keeps verification off the restore's critical path."""
    h = blake3()
    view = _byte_view(arr if arr.flags.c_contiguous else arr.copy(order="C"))
    for start in range(0, len(view), HASH_CHUNK):
        h.update(view[start : start + HASH_CHUNK])
    return CHECKSUM_PREFIX + h.hexdigest()


def _check_content(
    content: CheckpointContent, tensors: Mapping[str, np.ndarray], limits: Limits = DEFAULT_LIMITS
) -> None:
    """Refuse, before anything is written, what a reader would refuse: content the manifest
    cannot carry faithfully, and tensors over the read bounds (``Limits``)."""
    where = f"{content.run_id}/{content.kind}/{content.step}"
    names = list(tensors)
    for name in names:
        if not 1 <= len(name) <= 256:
            raise TensorSpecError(field="tensors", expected="names of 1 to 256 characters", found=name[:80])
    if len(names) > limits.max_tensors:
        raise SizeLimitError(field="tensors", expected=f"<= {limits.max_tensors} tensors", found=len(names))
    total = sum(int(a.nbytes) for a in tensors.values())
    if total > limits.max_total_bytes:
        raise SizeLimitError(field="total_bytes", expected=f"<= {limits.max_total_bytes}", found=total)
    deep = [n for n, a in tensors.items() if a.ndim > limits.max_ndim]
    if deep:
        raise TensorSpecError(field=f"tensors[{deep[0]}].shape", expected=f"<= {limits.max_ndim} dims", found=None)
    body = {
        "config": content.config,
        "lineage": None if content.lineage is None else content.lineage.model_dump(mode="json"),
        "rng": content.rng,
        "meta": content.meta,
        "tensors": names,
    }
    found = non_finite_path(body)
    if found is not None:
        raise InvariantError(
            "checkpoint content must be finite JSON", field=found[0], expected="a finite number", found=found[1]
        )
    try:
        text = json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvariantError(f"{where}: checkpoint content is not plain JSON ({exc})") from None
    # The reader's bounds, applied at write time: what commits can always be read back.
    parse_json(
        text.encode(),
        where=f"{where} content",
        error=InvariantError,
        limits=JsonLimits(max_bytes=limits.max_manifest_bytes),
    )


@dataclass
class _ShardPlan:
    key: str
    names: list[str]
    nbytes: int


def _plan_shards(arrays: Mapping[str, np.ndarray], nonce: str, rank: int, shard_bytes: int) -> list[_ShardPlan]:
    plans: list[_ShardPlan] = []
    current: _ShardPlan | None = None
    for name in sorted(arrays):
        size = arrays[name].nbytes
        if current is None or (current.nbytes and current.nbytes + size > shard_bytes):
            current = _ShardPlan(key=f"{nonce}/rank{rank:03d}-{len(plans):04d}.bin", names=[], nbytes=0)
            plans.append(current)
        current.names.append(name)
        current.nbytes += size
    return plans


def _write_shard(
    store: Store, prefix: str, plan: _ShardPlan, arrays: Mapping[str, np.ndarray], rank: int
) -> tuple[ShardEntry, list[TensorEntry]]:
    """Stream one shard to the store, hashing each chunk on its way out."""
    entries: list[TensorEntry] = []

    def chunks() -> Iterator[memoryview]:
        offset = 0
        for name in plan.names:
            arr = arrays[name]
            view = _byte_view(arr)
            h = blake3()
            for start in range(0, len(view), HASH_CHUNK):
                piece = view[start : start + HASH_CHUNK]
                h.update(piece)
                yield piece
            entries.append(
                TensorEntry(
                    name=name,
                    dtype=arr.dtype.str,
                    shape=list(arr.shape),
                    shard=plan.key,
                    offset=offset,
                    length=arr.nbytes,
                    checksum=CHECKSUM_PREFIX + h.hexdigest(),
                )
            )
            offset += arr.nbytes

    store.write_object(f"{prefix}/{plan.key}", chunks(), size=plan.nbytes)
    if len(entries) != len(plan.names):  # a store must consume every chunk
        raise RuntimeError(f"store {store.url} did not consume shard {plan.key}")
    return ShardEntry(key=plan.key, rank=rank, bytes=plan.nbytes), entries


@dataclass(frozen=True)
class RankShards:
    """What one writer (rank) wrote: its shard files and the index of its tensors."""

    rank: int
    shards: list[ShardEntry]
    tensors: list[TensorEntry]


def new_save_nonce() -> str:
    """One per save attempt, shared by all its ranks: names the attempt's shard files."""
    return uuid.uuid4().hex[:16]


def write_shards(
    store: Store,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    *,
    nonce: str,
    rank: int = 0,
    shard_bytes: int = 64 << 20,
    max_workers: int = 4,
) -> RankShards:
    """Phase 1, run by every rank for its own tensors: stream them out as shard files.

    Shards are named ``NONCE/rankRRR-NNNN.bin`` under the checkpoint prefix, so ranks never
    collide and a losing attempt never overwrites the winner's bytes.
    """
    _check_content(content, tensors)
    arrays = {name: _as_le_contiguous(a) for name, a in tensors.items()}
    prefix = CheckpointRef("", content.run_id, content.kind, content.step).prefix
    plans = _plan_shards(arrays, nonce, rank, shard_bytes)
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(plans)))) as pool:
        results = list(pool.map(lambda p: _write_shard(store, prefix, p, arrays, rank), plans))
    return RankShards(rank=rank, shards=[s for s, _ in results], tensors=[e for _, es in results for e in es])


def commit_manifest(
    store: Store,
    content: CheckpointContent,
    ranks: list[RankShards],
    *,
    nonce: str,
    signer: Signer | None = None,
) -> CommitResult:
    """Phase 2, run once (by the coordinator) after every rank's shards are durable:
    commit one manifest listing all of them, by create-if-absent. This is the commit."""
    mkey = manifest_key(content.run_id, content.kind, content.step)
    ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
    entries = sorted((e for r in ranks for e in r.tensors), key=lambda e: e.name)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise TensorSpecError("two ranks wrote the same tensor", field="tensors", found=sorted(names))
    shards = [s for r in sorted(ranks, key=lambda r: r.rank) for s in r.shards]
    fingerprint = content.fingerprint([(e.name, e.dtype, e.shape, e.checksum) for e in entries])
    manifest = Manifest(
        kind=content.kind,
        run_id=content.run_id,
        step=content.step,
        cursor=content.cursor,
        config=content.config,
        lineage=content.lineage,
        rng=content.rng,
        meta=content.meta,
        tensors=entries,
        shards=shards,
        total_bytes=sum(e.length for e in entries),
        fingerprint=fingerprint,
        writer=WriterInfo(
            nonce=nonce, ranks=max(1, len(ranks)), created_at=datetime.now(UTC).isoformat(timespec="seconds")
        ),
    )
    if signer is not None:
        manifest = manifest.model_copy(update={"signature": signer.sign(manifest.signed_payload())})
    orphans = [f"{ref.prefix}/{s.key}" for s in shards]
    raw = manifest.to_json_bytes()
    if len(raw) > DEFAULT_LIMITS.max_manifest_bytes:  # a reader would refuse it: do not commit it
        store.delete(orphans)
        raise SizeLimitError(field="manifest", expected=f"<= {DEFAULT_LIMITS.max_manifest_bytes} bytes", found=len(raw))
    if store.put_if_absent(mkey, raw):
        # Trust, then verify: if a store ever ignored the condition and another writer's
        # manifest replaced ours, the fingerprint comparison below still catches it.
        committed = parse_manifest(store.read(mkey), str(ref))
        if committed.writer.nonce == nonce:
            return CommitResult(ref=ref, manifest=manifest, created=True)
        return _converge(store, ref, mkey, fingerprint, orphan_keys=[])
    return _converge(store, ref, mkey, fingerprint, orphan_keys=orphans)


def write_checkpoint(
    store: Store,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    *,
    signer: Signer | None = None,
    shard_bytes: int = 64 << 20,
    max_workers: int = 4,
) -> CommitResult:
    """Single-writer save: shards, then the manifest, under the (run, kind, step) key."""
    _check_content(content, tensors)
    mkey = manifest_key(content.run_id, content.kind, content.step)
    if store.exists(mkey):
        # A retry (or a stale writer) of a committed step: compare, don't rewrite.
        arrays = {name: _as_le_contiguous(a) for name, a in tensors.items()}
        index = [(n, a.dtype.str, list(a.shape), tensor_checksum(a)) for n, a in sorted(arrays.items())]
        ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
        return _converge(store, ref, mkey, content.fingerprint(index), orphan_keys=[])
    nonce = new_save_nonce()
    rank0 = write_shards(store, content, tensors, nonce=nonce, shard_bytes=shard_bytes, max_workers=max_workers)
    return commit_manifest(store, content, [rank0], nonce=nonce, signer=signer)


def _converge(store: Store, ref: CheckpointRef, mkey: str, fingerprint: str, orphan_keys: list[str]) -> CommitResult:
    """Another writer committed this key first: identical content is success, else conflict."""
    existing = parse_manifest(store.read(mkey), str(ref))
    store.delete(orphan_keys)  # only this attempt's nonce-named shards: nobody else refers to them
    if existing.fingerprint != fingerprint:
        raise CheckpointConflictError(
            "a different checkpoint is already committed under this idempotency key "
            f"({ref.run_id}/{ref.kind}/{ref.step}): the run is not deterministic, or two runs share an id",
            field="fingerprint",
            expected=existing.fingerprint,
            found=fingerprint,
        )
    return CommitResult(ref=ref, manifest=existing, created=False)


def parse_manifest(raw: bytes, where: str, *, limits: Limits = DEFAULT_LIMITS) -> Manifest:
    """Bounded JSON (``cairn.bounded_json``), then format name/version, then the schema."""
    data = parse_json(raw, where=where, error=ManifestError, limits=JsonLimits(max_bytes=limits.max_manifest_bytes))
    if not isinstance(data, dict):
        raise ManifestError(field="manifest", expected="a JSON object", found=type(data).__name__)
    if data.get("format") != FORMAT_NAME:
        raise FormatVersionError(field="format", expected=FORMAT_NAME, found=data.get("format"))
    if data.get("format_version") not in SUPPORTED_VERSIONS:
        raise FormatVersionError(
            field="format_version", expected=sorted(SUPPORTED_VERSIONS), found=data.get("format_version")
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "manifest"
        ctx_error = first.get("ctx", {}).get("error")
        msg = str(ctx_error) if first["type"] == "value_error" and ctx_error is not None else first["msg"]
        raise ManifestError(f"{msg} (found {json.dumps(first.get('input'), default=str)[:80]})", field=loc) from exc


def _check_structure(manifest: Manifest, limits: Limits) -> None:
    """Declared sizes and layout, checked before any tensor is allocated."""
    if len(manifest.tensors) > limits.max_tensors:
        raise SizeLimitError(field="tensors", expected=f"<= {limits.max_tensors} tensors", found=len(manifest.tensors))
    if manifest.total_bytes > limits.max_total_bytes:
        raise SizeLimitError(field="total_bytes", expected=f"<= {limits.max_total_bytes}", found=manifest.total_bytes)
    shards = {s.key: s for s in manifest.shards}
    if len(shards) != len(manifest.shards):
        raise ManifestError("a shard is listed twice", field="shards", found=[s.key for s in manifest.shards])
    seen: set[str] = set()
    total = 0
    for t in manifest.tensors:
        where = f"tensors[{t.name}]"
        if t.name in seen:
            raise TensorSpecError("duplicate tensor name", field=where)
        seen.add(t.name)
        if t.dtype not in ALLOWED_DTYPES:
            raise TensorSpecError(field=f"{where}.dtype", expected=sorted(ALLOWED_DTYPES), found=t.dtype)
        if len(t.shape) > limits.max_ndim or any(not 0 <= d <= MAX_DIM for d in t.shape):
            raise TensorSpecError(
                field=f"{where}.shape", expected=f"<= {limits.max_ndim} dims, each in [0, {MAX_DIM}]", found=t.shape
            )
        want = math.prod(t.shape) * np.dtype(t.dtype).itemsize  # Python ints: cannot overflow
        if want > limits.max_total_bytes:
            raise SizeLimitError(field=f"{where}.shape", expected=f"<= {limits.max_total_bytes} bytes", found=want)
        if t.length != want:
            raise TensorSpecError(
                "byte length disagrees with dtype x shape",
                field=f"{where}.length",
                expected=want,
                found=t.length,
            )
        shard = shards.get(t.shard)
        if shard is None:
            raise TensorSpecError(field=f"{where}.shard", expected=sorted(shards), found=t.shard)
        if t.offset + t.length > shard.bytes:
            raise TensorSpecError(
                "tensor runs past the end of its shard",
                field=f"{where}.offset",
                expected=f"offset + length <= {shard.bytes}",
                found=t.offset + t.length,
            )
        total += t.length
    if total != manifest.total_bytes:
        raise TensorSpecError(field="total_bytes", expected=total, found=manifest.total_bytes)


def read_manifest(
    store: Store,
    ref: CheckpointRef,
    *,
    expect_kind: CheckpointKind | None,
    limits: Limits = DEFAULT_LIMITS,
    signer: Signer | None = None,
) -> Manifest:
    """Read and check a committed manifest: size, format, schema, kind, signature, layout, fingerprint."""
    key = f"{ref.prefix}/{MANIFEST_NAME}"
    try:
        size = store.size(key)
    except ObjectNotFoundError:
        raise CheckpointNotFoundError(
            f"no committed checkpoint at {ref} (manifest missing: never written, or not yet committed)"
        ) from None
    if size > limits.max_manifest_bytes:
        raise SizeLimitError(field="manifest", expected=f"<= {limits.max_manifest_bytes} bytes", found=size)
    manifest = parse_manifest(store.read(key), str(ref), limits=limits)
    if expect_kind is not None and manifest.kind != expect_kind:
        raise KindMismatchError(
            f"a {manifest.kind.value} checkpoint cannot be restored as {expect_kind.value} state",
            field="kind",
            expected=expect_kind.value,
            found=manifest.kind.value,
        )
    for name, want, found in (
        ("run_id", ref.run_id, manifest.run_id),
        ("step", ref.step, manifest.step),
        ("kind", ref.kind.value, manifest.kind.value),
    ):
        if want != found:
            raise IntegrityError("manifest does not match its location", field=name, expected=want, found=found)
    if signer is not None:
        signer.verify(manifest.signed_payload(), manifest.signature)
    _check_structure(manifest, limits)
    recomputed = CheckpointContent(
        kind=manifest.kind,
        run_id=manifest.run_id,
        step=manifest.step,
        cursor=manifest.cursor,
        config=manifest.config,
        lineage=manifest.lineage,
        rng=manifest.rng,
        meta=manifest.meta,
    ).fingerprint([(t.name, t.dtype, t.shape, t.checksum) for t in manifest.tensors])
    if recomputed != manifest.fingerprint:
        raise IntegrityError(
            "manifest content does not match its fingerprint (edited or corrupted)",
            field="fingerprint",
            expected=recomputed,
            found=manifest.fingerprint,
        )
    return manifest


ValueCheck = Callable[[str, np.ndarray], None]


def _check_shards_present(store: Store, ref: CheckpointRef, manifest: Manifest) -> None:
    """Every listed shard exists with its declared size, so no ranged read can fall short."""
    for shard in manifest.shards:
        key = f"{ref.prefix}/{shard.key}"
        try:
            size = store.size(key)
        except ObjectNotFoundError:
            raise IntegrityError("shard listed in the manifest is missing", field=f"shards[{shard.key}]") from None
        if size != shard.bytes:
            raise IntegrityError(field=f"shards[{shard.key}].bytes", expected=shard.bytes, found=size)


def verify_tensors(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    value_check: ValueCheck | None = None,
    chunk_bytes: int = 8 << 20,
) -> None:
    """Check every tensor's checksum (and, with ``value_check``, its values) without ever
    holding a whole tensor: each is streamed through one reusable buffer of ``chunk_bytes``.

    ``manifest`` is one ``read_manifest`` returned (its layout is checked). Memory stays at one
    buffer whatever the checkpoint declares, so a forged multi-GiB checkpoint fails on its
    first missing shard or bad checksum with a typed error, never ``MemoryError``. Chunks hold
    whole elements (their length is a multiple of the itemsize), so ``value_check(name,
    chunk)`` sees a 1-D array of the tensor's dtype, as with ``read_tensors``. Tensors are
    checked in shard order, sequentially.
    """
    _check_shards_present(store, ref, manifest)
    buffer = np.empty(max(chunk_bytes, 8) // 8 * 8, dtype=np.uint8)  # whole elements of any dtype
    view = _byte_view(buffer)
    for entry in sorted(manifest.tensors, key=lambda t: (t.shard, t.offset, t.name)):
        dtype = np.dtype(entry.dtype)
        step = buffer.size // dtype.itemsize * dtype.itemsize
        h = blake3()
        for start in range(0, entry.length, step):
            size = min(step, entry.length - start)
            store.read_into(f"{ref.prefix}/{entry.shard}", entry.offset + start, view[:size])
            h.update(view[:size])
            if value_check is not None:
                value_check(entry.name, buffer[:size].view(dtype))
        found = CHECKSUM_PREFIX + h.hexdigest()
        if found != entry.checksum:
            raise IntegrityError(
                "tensor bytes do not match their checksum",
                field=f"tensors[{entry.name}].checksum",
                expected=entry.checksum,
                found=found,
            )


def read_tensors(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    max_workers: int = 4,
    value_check: ValueCheck | None = None,
) -> dict[str, np.ndarray]:
    """Allocate each tensor from its declared dtype/shape, fill it by ranged read, verify its
    checksum and (optionally) its values.

    Tensors load concurrently; within a tensor, hashing and ``value_check`` run chunk by chunk
    in one pass while the chunk is hot in cache. ``value_check(name, chunk)`` raises to refuse.
    Every tensor is allocated whole: to check a checkpoint without holding it, use
    ``verify_tensors``.
    """
    _check_shards_present(store, ref, manifest)

    def load(entry: TensorEntry) -> tuple[str, np.ndarray]:
        arr = np.empty(entry.shape, dtype=np.dtype(entry.dtype))
        if entry.length:
            store.read_into(f"{ref.prefix}/{entry.shard}", entry.offset, _byte_view(arr))
        flat = arr.reshape(-1)
        step = max(1, CHECK_CHUNK // max(1, arr.itemsize))
        h = blake3()
        for start in range(0, flat.size, step):
            chunk = flat[start : start + step]
            h.update(_byte_view(chunk))
            if value_check is not None:
                value_check(entry.name, chunk)
        found = CHECKSUM_PREFIX + h.hexdigest()
        if found != entry.checksum:
            raise IntegrityError(
                "tensor bytes do not match their checksum",
                field=f"tensors[{entry.name}].checksum",
                expected=entry.checksum,
                found=found,
            )
        return entry.name, arr

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(manifest.tensors)))) as pool:
        return dict(pool.map(load, manifest.tensors))
