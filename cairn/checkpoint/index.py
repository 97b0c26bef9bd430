"""Per-rank index objects (format v3): metadata that grows with ranks, not with blocks.

Each rank of a blocked save writes, beside its shards, one index object listing its shards and
block entries (``RUN/KIND/STEP/NONCE/rankRRR.index.json``) and reports only an ``IndexRef`` —
key, size, BLAKE3 checksum, entry count, bytes, digest and the block ranges it covers — to the
coordinator, whose root manifest lists those refs. So the root is O(ranks + tensors) and each
index O(its blocks); a restore at any world size reads the root and only the indexes covering
its slice (``expand``).

The fingerprint stays independent of the world size: it covers the block count and the *index
digest*, the sum modulo 2**256 of a sha256 per block entry (name, dtype, shape, checksum).
Each rank computes its own share; the shares add up to the same digest however the blocks were
split among ranks. Like the fingerprint, the digest is an identifier that detects accidental
change, not a signature — and, being additive, weaker than a sequential hash against a forger
searching for collisions (generalized birthday): authenticity comes from the root's signature,
which covers every index's checksum and so every entry.

What is checked, before anything is allocated: from the root alone (``check_index_refs``) that
the refs' covers tile every declared tensor's blocks exactly once and their counts and bytes
add up; from each index read (``read_rank_index``) that its bytes hash to the root's checksum,
that it is this checkpoint's and this rank's, and that its entries are exactly the blocks it
claims to cover, of the declared dtype and length, inside its shards, with the declared digest.
An incremental save's index may also list ``linked`` shards — full keys of shards of other
checkpoints of the same run and kind (``layout.linked_shard``), exactly those its ref lists —
whose blocks it references; any other key is refused.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from blake3 import blake3
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from cairn.checkpoint.blocks import SEPARATOR, base_name, block_count, block_range
from cairn.checkpoint.codec import FRAME_RECORD_BYTES, MIN_FRAME_BYTES, check_encoding
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.layout import RUN_ID_PATTERN, attempt_prefix, checkpoint_prefix, index_key, linked_shard
from cairn.checkpoint.manifest import (
    CheckpointKind,
    Cover,
    IndexRef,
    Manifest,
    PartSpec,
    ShardEntry,
    TensorEntry,
)
from cairn.checkpoint.options import Limits
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import RankShards
from cairn.checkpoint.tensors import CHECKSUM_PREFIX, dtype_from_tag, require_in_shard
from cairn.errors import IntegrityError, ManifestError, ObjectNotFoundError, SizeLimitError, TensorSpecError
from cairn.jsonio import JsonLimits, parse_json
from cairn.stores.base import Store

__all__ = [
    "INDEX_FORMAT",
    "RankIndex",
    "entry_digest",
    "index_summary",
    "summary_of",
    "covers_of",
    "write_rank_index",
    "check_index_refs",
    "read_rank_index",
    "indexes_covering",
    "expand",
    "attempt_keys",
]

INDEX_FORMAT = "cairn-rank-index"
INDEX_BYTES_PER_ENTRY = 2048
"""The most an index object may weigh per block entry (an entry and its share of a shard: ~400 B)."""
_MODULUS = 1 << 256


class RankIndex(BaseModel):
    """One rank's index object: its shards and block entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["cairn-rank-index"] = "cairn-rank-index"
    format_version: Literal[3] = 3
    run_id: str = Field(pattern=RUN_ID_PATTERN.pattern)
    kind: CheckpointKind
    step: int = Field(ge=0)
    rank: int = Field(ge=0)
    shards: list[ShardEntry]
    tensors: list[TensorEntry]
    linked: list[ShardEntry] = Field(default_factory=list)
    """Shards of other checkpoints of the run (full keys) whose blocks some entries reference."""

    @model_serializer(mode="wrap")
    def _unlinked_as_before(self, handler: Any) -> Any:
        body = handler(self)
        if not body.get("linked"):
            body.pop("linked", None)
        return body


def entry_digest(name: str, dtype: str, shape: Iterable[int], checksum: str) -> int:
    """One block entry's term of the index digest."""
    text = f"{name}\0{dtype}\0{','.join(str(d) for d in shape)}\0{checksum}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest(), "big")


def _digest_hex(value: int) -> str:
    return f"{value % _MODULUS:064x}"


def summary_of(entries: Iterable[tuple[str, str, list[int], str]]) -> dict[str, object]:
    """The fingerprint's ``index`` (block count and digest) of these block entries: what the
    refs of any split of them among ranks add up to (``index_summary``)."""
    count, total = 0, 0
    for name, dtype, shape, checksum in entries:
        count += 1
        total += entry_digest(name, dtype, shape, checksum)
    return {"blocks": count, "digest": _digest_hex(total)}


def index_summary(refs: Iterable[IndexRef]) -> dict[str, object]:
    """The fingerprint's ``index`` of a v3 manifest, from its refs alone."""
    refs = list(refs)
    return {
        "blocks": sum(r.entries for r in refs),
        "digest": _digest_hex(sum(int(r.digest, 16) for r in refs)),
    }


def _block_index(entry_name: str) -> int:
    head, sep, tail = entry_name.rpartition(SEPARATOR)
    if not sep or not head or not 5 <= len(tail) <= 12 or not tail.isdigit() or f"{int(tail):05d}" != tail:
        raise TensorSpecError(field="tensors", expected="block entries named NAME#IIIII", found=entry_name[:80])
    return int(tail)


def covers_of(names: Iterable[str]) -> list[Cover]:
    """The block ranges ``names`` (block entry names) make up: one per run of consecutive blocks."""
    by_tensor: dict[str, list[int]] = defaultdict(list)
    for name in names:
        by_tensor[base_name(name)].append(_block_index(name))
    out: list[Cover] = []
    for tensor in sorted(by_tensor):
        indices = sorted(by_tensor[tensor])
        first = prev = indices[0]
        for i in indices[1:]:
            if i != prev + 1:
                out.append((tensor, first, prev + 1))
                first = i
            prev = i
        out.append((tensor, first, prev + 1))
    return out


def write_rank_index(store: Store, content: CheckpointContent, shards: RankShards, *, nonce: str) -> IndexRef:
    """Phase 1's last write on every rank of a v3 save: its index object (after its shards)."""
    index = RankIndex(
        run_id=content.run_id,
        kind=content.kind,
        step=content.step,
        rank=shards.rank,
        shards=shards.shards,
        tensors=sorted(shards.tensors, key=lambda t: t.name),
        linked=sorted(shards.linked, key=lambda s: s.key),
    )
    raw = index.model_dump_json().encode()
    key = index_key(nonce, shards.rank)
    store.write_object(f"{checkpoint_prefix(content.run_id, content.kind, content.step)}/{key}", [raw], size=len(raw))
    digest = sum(entry_digest(t.name, t.dtype, t.shape, t.checksum) for t in index.tensors)
    return IndexRef(
        rank=shards.rank,
        key=key,
        bytes=len(raw),
        checksum=CHECKSUM_PREFIX + blake3(raw).hexdigest(),
        entries=len(index.tensors),
        total_bytes=sum(t.length for t in index.tensors),
        digest=_digest_hex(digest),
        covers=covers_of(t.name for t in index.tensors),
        linked=[s.key for s in index.linked],
    )


def index_bound(entries: int, total_bytes: int) -> int:
    """The most an index of ``entries`` block entries over ``total_bytes`` logical bytes may
    weigh: each entry, and the frame records of compressed entries (``cairn.checkpoint.codec``)."""
    return INDEX_BYTES_PER_ENTRY * (entries + 1) + FRAME_RECORD_BYTES * -(-total_bytes // MIN_FRAME_BYTES)


def _range_bytes(spec: PartSpec, first: int, stop: int) -> int:
    itemsize = dtype_from_tag(str(spec.dtype)).itemsize
    return (block_range(spec, stop - 1)[1] - block_range(spec, first)[0]) * itemsize


def check_index_refs(manifest: Manifest, limits: Limits) -> None:
    """From the root alone: the refs' covers tile every declared tensor's blocks exactly once,
    their entry counts and bytes add up, and nothing is past the bounds."""
    refs, parts = manifest.indexes or [], manifest.parts or {}
    if len({r.rank for r in refs}) != len(refs) or len({r.key for r in refs}) != len(refs):
        raise ManifestError("a rank index is listed twice", field="indexes", found=[r.rank for r in refs][:20])
    blocks = sum(r.entries for r in refs)
    if blocks > limits.max_blocks:
        raise SizeLimitError(
            field="indexes", expected=f"<= {limits.max_blocks} blocks ({limits.sized_by})", found=blocks
        )
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for ref in refs:
        where = f"indexes[{ref.rank}]"
        if ref.key != index_key(manifest.writer.nonce, ref.rank):  # all of a save lies under its nonce
            raise ManifestError(
                field=f"{where}.key", expected=index_key(manifest.writer.nonce, ref.rank), found=ref.key[:80]
            )
        _check_linked(manifest, ref, where)
        bound = min(limits.max_index_bytes, index_bound(ref.entries, ref.total_bytes))
        if ref.bytes > bound:
            raise SizeLimitError(
                field=f"{where}.bytes",
                expected=f"<= {bound} ({INDEX_BYTES_PER_ENTRY} a block entry, {FRAME_RECORD_BYTES} a "
                f"compressed frame of >= {MIN_FRAME_BYTES} bytes, at most {limits.max_index_bytes})",
                found=ref.bytes,
            )
        covered, nbytes = 0, 0
        for tensor, first, stop in ref.covers:
            spec = parts.get(tensor)
            if spec is None:
                raise TensorSpecError("covers a tensor that is not declared", field=f"{where}.covers", found=tensor)
            if not 0 <= first < stop <= block_count(spec):
                raise TensorSpecError(
                    field=f"{where}.covers[{tensor}]",
                    expected=f"0 <= first < stop <= {block_count(spec)}",
                    found=[first, stop],
                )
            ranges[tensor].append((first, stop))
            covered += stop - first
            nbytes += _range_bytes(spec, first, stop)
        if covered != ref.entries:
            raise TensorSpecError(field=f"{where}.entries", expected=covered, found=ref.entries)
        if nbytes != ref.total_bytes:
            raise TensorSpecError(field=f"{where}.total_bytes", expected=nbytes, found=ref.total_bytes)
    for tensor, spec in parts.items():
        at = 0
        for first, stop in sorted(ranges.get(tensor, [])):
            if first != at:
                what = "blocks covered twice" if first < at else "blocks covered by no rank index"
                raise TensorSpecError(what, field=f"parts[{tensor}]", expected=f"block {at}", found=f"block {first}")
            at = stop
        if at != block_count(spec):
            raise TensorSpecError(
                "blocks covered by no rank index", field=f"parts[{tensor}]", expected=block_count(spec), found=at
            )
    declared = sum(math.prod(p.shape) * dtype_from_tag(str(p.dtype)).itemsize for p in parts.values())
    if sum(r.total_bytes for r in refs) != manifest.total_bytes or declared != manifest.total_bytes:
        raise TensorSpecError(field="total_bytes", expected=declared, found=manifest.total_bytes)


def _check_linked(manifest: Manifest, ref: IndexRef, where: str) -> None:
    """A ref's linked shards: each a shard of another checkpoint of this run and kind, once,
    and no more of them than the blocks it holds."""
    if len(ref.linked) > max(1, ref.entries) or len(set(ref.linked)) != len(ref.linked):
        raise SizeLimitError(
            field=f"{where}.linked", expected=f"<= {max(1, ref.entries)} distinct shards", found=len(ref.linked)
        )
    for key in ref.linked:
        if linked_shard(key, manifest.run_id, manifest.kind.value, manifest.step) is None:
            raise IntegrityError(
                f"a rank index references a shard outside this run's {manifest.kind.value} checkpoints",
                field=f"{where}.linked",
                expected=f"{manifest.run_id}/{manifest.kind.value}/STEP/NONCE/rankRRR-NNNN.bin of another step",
                found=key[:120],
            )


def _index_error(where: str, message: str, **kw: object) -> IntegrityError:
    return IntegrityError(message, field=where, **kw)


def read_rank_index(store: Store, ref: CheckpointRef, manifest: Manifest, iref: IndexRef) -> RankIndex:
    """Read one rank index and prove it is exactly what the root references (see the module)."""
    where = f"indexes[{iref.rank}]"
    key = f"{ref.prefix}/{iref.key}"
    try:
        raw = store.read(key, iref.bytes)  # a larger object is refused by its size, unread
    except ObjectNotFoundError:
        raise _index_error(where, "a rank index listed in the manifest is missing") from None
    except SizeLimitError as exc:
        raise _index_error(
            f"{where}.bytes", "a rank index's size differs from the manifest's", expected=iref.bytes, found=exc.found
        ) from None
    if len(raw) != iref.bytes:
        raise _index_error(
            f"{where}.bytes", "a rank index's size differs from the manifest's", expected=iref.bytes, found=len(raw)
        )
    found = CHECKSUM_PREFIX + blake3(raw).hexdigest()
    if found != iref.checksum:
        raise _index_error(
            f"{where}.checksum", "a rank index does not match its checksum", expected=iref.checksum, found=found
        )
    data = parse_json(raw, where=key, error=ManifestError, limits=JsonLimits(max_bytes=max(iref.bytes, 1)))
    # Counts before the model is built: a forged index cannot make the schema check allocate.
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("tensors"), list)
        or not isinstance(data.get("shards"), list)
    ):
        raise ManifestError(field=where, expected="a rank index object with tensors and shards lists", found=None)
    linked = data.get("linked", [])
    if not isinstance(linked, list) or len(linked) != len(iref.linked):
        raise _index_error(f"{where}.linked", "a rank index's linked shards disagree with the manifest")
    if len(data["tensors"]) != iref.entries or len(data["shards"]) > max(1, iref.entries):
        raise TensorSpecError(
            "a rank index's entries disagree with the manifest",
            field=f"{where}.tensors",
            expected=f"{iref.entries} entries in at most {max(1, iref.entries)} shards",
            found=f"{len(data['tensors'])} entries in {len(data['shards'])} shards",
        )
    try:
        index = RankIndex.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "index"
        raise ManifestError(f"{first['msg']}", field=f"{where}.{loc}") from exc
    for name, want, got in (
        ("run_id", manifest.run_id, index.run_id),
        ("kind", manifest.kind.value, index.kind.value),
        ("step", manifest.step, index.step),
        ("rank", iref.rank, index.rank),
    ):
        if want != got:
            raise _index_error(f"{where}.{name}", "a rank index belongs elsewhere", expected=want, found=got)
    run, kind, step = manifest.run_id, manifest.kind.value, manifest.step
    stray = [
        s.key
        for s in index.shards
        if not s.key.startswith(f"{manifest.writer.nonce}/") or linked_shard(s.key, run, kind, step) is not None
    ]
    if stray:
        raise ManifestError(
            field=f"{where}.shards", expected=f"keys under {manifest.writer.nonce}/", found=stray[0][:80]
        )
    if [s.key for s in index.linked] != sorted(iref.linked):
        raise _index_error(f"{where}.linked", "a rank index's linked shards disagree with the manifest")
    _check_entries(index, iref, manifest.parts or {}, where)
    return index


def _check_entries(index: RankIndex, iref: IndexRef, parts: Mapping[str, PartSpec], where: str) -> None:
    if len(index.tensors) != iref.entries:
        raise TensorSpecError(field=f"{where}.tensors", expected=iref.entries, found=len(index.tensors))
    sizes = {s.key: s.bytes for s in [*index.shards, *index.linked]}
    if len(sizes) != len(index.shards) + len(index.linked):
        raise ManifestError("a shard is listed twice", field=f"{where}.shards")
    allowed = {(t, i) for t, first, stop in iref.covers for i in range(first, stop)}
    seen: set[str] = set()
    total, digest = 0, 0
    for t in index.tensors:
        at = f"{where}.tensors[{t.name}]"
        tensor, i = base_name(t.name), _block_index(t.name)
        if (tensor, i) not in allowed or t.name in seen:
            raise TensorSpecError("an entry outside the blocks its index covers", field=at)
        seen.add(t.name)
        spec = parts[tensor]
        start, stop = block_range(spec, i)
        if t.dtype != spec.dtype:
            raise TensorSpecError(field=f"{at}.dtype", expected=spec.dtype, found=t.dtype)
        if t.shape != [stop - start]:
            raise TensorSpecError(field=f"{at}.shape", expected=[stop - start], found=t.shape)
        if t.length != (stop - start) * dtype_from_tag(t.dtype).itemsize:
            raise TensorSpecError("byte length disagrees with dtype x shape", field=f"{at}.length", found=t.length)
        check_encoding(at, t, dtype_from_tag(t.dtype).itemsize)
        require_in_shard(at, t.shard, t.offset, t.stored_length, sizes)
        total += t.length
        digest += entry_digest(t.name, t.dtype, t.shape, t.checksum)
    if total != iref.total_bytes:
        raise TensorSpecError(field=f"{where}.total_bytes", expected=iref.total_bytes, found=total)
    if _digest_hex(digest) != iref.digest:
        raise _index_error(
            f"{where}.digest",
            "a rank index's entries do not match its digest",
            expected=iref.digest,
            found=_digest_hex(digest),
        )


def indexes_covering(manifest: Manifest, blocks: Collection[str]) -> list[IndexRef]:
    """The refs whose covers hold any of ``blocks`` (block entry names), by rank."""
    wanted: dict[str, list[int]] = defaultdict(list)
    for name in blocks:
        wanted[base_name(name)].append(_block_index(name))
    for indices in wanted.values():
        indices.sort()
    out = []
    for ref in manifest.indexes or []:
        for tensor, first, stop in ref.covers:
            have = wanted.get(tensor)
            if have and (k := bisect.bisect_left(have, first)) < len(have) and have[k] < stop:
                out.append(ref)
                break
    return out


def expand(
    store: Store, ref: CheckpointRef, manifest: Manifest, blocks: Collection[str] | None = None, *, workers: int = 8
) -> Manifest:
    """``manifest`` with the entries and shards of its rank indexes filled in — all of them, or
    (``blocks``) only those of the indexes covering these blocks — each index read and checked
    (concurrently). A v1/v2 manifest is returned as it is."""
    if manifest.indexes is None:
        return manifest
    refs = manifest.indexes if blocks is None else indexes_covering(manifest, blocks)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(refs)))) as pool:
        indexes = list(pool.map(lambda r: read_rank_index(store, ref, manifest, r), refs))
    shards = [s for index in indexes for s in index.shards]
    if len({s.key for s in shards}) != len(shards):
        raise ManifestError("two rank indexes list the same shard", field="indexes")
    linked: dict[str, ShardEntry] = {}  # ranks may reference the same earlier shard
    for s in (s for index in indexes for s in index.linked):
        if linked.setdefault(s.key, s).bytes != s.bytes:
            raise ManifestError(
                "two rank indexes disagree on a linked shard's size", field="indexes", found=s.key[:120]
            )
    shards += sorted(linked.values(), key=lambda s: s.key)
    tensors = sorted((t for index in indexes for t in index.tensors), key=lambda t: t.name)
    return manifest.model_copy(update={"tensors": tensors, "shards": shards})


def attempt_keys(store: Store, run_id: str, kind: str, step: int, nonce: str) -> Iterator[str]:
    """Every object one save attempt wrote (its ranks' shards and indexes): what it deletes when
    it loses or fails (one listing: the coordinator knows only the refs)."""
    for info in store.list(attempt_prefix(run_id, kind, step, nonce)):
        yield info.key
