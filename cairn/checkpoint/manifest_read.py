"""Reading a manifest: the bytes under their bound, then format, schema, location, signature,
layout and fingerprint, each checked before anything is allocated for the tensors.

``manifest_bytes`` reads the object at a checkpoint's manifest key, refused above
``Limits.max_manifest_bytes`` by its size before a byte is read. ``parse_manifest`` decodes it
(bounded JSON, then the entry counts, then the schema: a forged manifest of millions of empty
entries is refused by its counts before a model is built). ``verify_manifest`` checks parsed
bytes as every reader does (kind, location, signature when a key is configured, layout,
fingerprint); ``read_manifest`` is both, and reads a v3 root's rank indexes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from pydantic import ValidationError

from cairn.checkpoint.blocks import check_parts, parts_json
from cairn.checkpoint.codec import check_encoding
from cairn.checkpoint.content import CheckpointContent, index_of
from cairn.checkpoint.index import check_index_refs, expand, index_summary
from cairn.checkpoint.layout import manifest_key
from cairn.checkpoint.manifest import FORMAT_NAME, SUPPORTED_VERSIONS, CheckpointKind, Manifest
from cairn.checkpoint.options import DEFAULT_LIMITS, CheckpointOptions, Limits, resolve_options
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import dtype_from_tag, require_in_shard, require_shape
from cairn.errors import (
    CheckpointNotFoundError,
    FormatVersionError,
    IntegrityError,
    KindMismatchError,
    ManifestError,
    ObjectNotFoundError,
    SizeLimitError,
    TensorSpecError,
)
from cairn.jsonio import JsonLimits, parse_json
from cairn.stores.base import Store

__all__ = ["parse_manifest", "manifest_bytes", "load_manifest_object", "read_manifest", "verify_manifest"]


def parse_manifest(raw: bytes, where: str, *, limits: Limits = DEFAULT_LIMITS) -> Manifest:
    """Bounded JSON (``cairn.jsonio``), then format name/version, then the schema."""
    data = parse_json(raw, where=where, error=ManifestError, limits=JsonLimits(max_bytes=limits.max_manifest_bytes))
    if not isinstance(data, dict):
        raise ManifestError(field="manifest", expected="a JSON object", found=type(data).__name__)
    if data.get("format") != FORMAT_NAME:
        raise FormatVersionError(field="format", expected=FORMAT_NAME, found=data.get("format"))
    version = data.get("format_version")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:  # (a list is not hashable)
        raise FormatVersionError(
            field="format_version", expected=sorted(SUPPORTED_VERSIONS), found=data.get("format_version")
        )
    # Counts before the model is built: a forged manifest of millions of entries is refused by
    # its counts, never turned into millions of objects (or of validation errors).
    for name, bound in (("tensors", limits.max_blocks), ("shards", limits.max_blocks), ("indexes", limits.max_blocks)):
        found = data.get(name)
        if isinstance(found, list | dict) and len(found) > bound:
            raise SizeLimitError(field=name, expected=f"<= {bound} entries", found=len(found))
    parts = data.get("parts")
    if isinstance(parts, dict) and len(parts) > limits.max_tensors:
        raise SizeLimitError(field="parts", expected=f"<= {limits.max_tensors} tensors", found=len(parts))
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "manifest"
        ctx_error = first.get("ctx", {}).get("error")
        msg = str(ctx_error) if first["type"] == "value_error" and ctx_error is not None else first["msg"]
        raise ManifestError(f"{msg} (found {json.dumps(first.get('input'), default=str)[:80]})", field=loc) from exc


def manifest_bytes(store: Store, ref: CheckpointRef, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The bytes at ``ref``'s manifest key: refused above ``limits.max_manifest_bytes`` by the
    object's size, before they are read (``SizeLimitError``); ``CheckpointNotFoundError`` when
    there is none."""
    try:
        return store.read(manifest_key(ref.run_id, ref.kind, ref.step), limits.max_manifest_bytes)
    except ObjectNotFoundError:
        raise CheckpointNotFoundError(
            f"no committed checkpoint at {ref} (manifest missing: never written, or not yet committed)"
        ) from None
    except SizeLimitError as exc:
        raise SizeLimitError(field="manifest", expected=exc.expected, found=exc.found) from None


def load_manifest_object(store: Store, ref: CheckpointRef, limits: Limits = DEFAULT_LIMITS) -> Manifest:
    """The manifest at ``ref``'s key, read under the bound and parsed (format, version, schema):
    not checked against its location, signature or fingerprint (``read_manifest`` does that) —
    for a writer comparing what is committed at a key it is writing."""
    return parse_manifest(manifest_bytes(store, ref, limits), str(ref), limits=limits)


def _check_structure(manifest: Manifest, limits: Limits) -> None:
    """Declared sizes and layout, checked before any tensor is allocated."""
    if manifest.indexes is not None:  # v3: the root's parts and rank index refs (O(ranks + tensors))
        parts = manifest.parts or {}
        if len(parts) > limits.max_tensors:
            raise SizeLimitError(field="parts", expected=f"<= {limits.max_tensors} tensors", found=len(parts))
        if manifest.total_bytes > limits.max_total_bytes:
            raise SizeLimitError(
                field="total_bytes",
                expected=f"<= {limits.max_total_bytes} ({limits.sized_by})",
                found=manifest.total_bytes,
            )
        declared = 0
        for name, spec in parts.items():
            require_shape(spec.shape, f"parts[{name}].shape", max_ndim=limits.max_ndim)
            declared += math.prod(spec.shape) * dtype_from_tag(str(spec.dtype), f"parts[{name}].dtype").itemsize
            if declared > limits.max_total_bytes:  # Python ints, from the root alone
                raise SizeLimitError(
                    "the declared tensors add up past the bound",
                    field=f"parts[{name}].shape",
                    expected=f"<= {limits.max_total_bytes} bytes in all ({limits.sized_by})",
                    found=declared,
                )
        check_parts(manifest)
        check_index_refs(manifest, limits)
        return
    if manifest.parts is not None and len(manifest.parts) > limits.max_tensors:  # v2: parts are the tensors
        raise SizeLimitError(field="parts", expected=f"<= {limits.max_tensors} tensors", found=len(manifest.parts))
    bound = limits.max_tensors if manifest.parts is None else limits.max_blocks
    if len(manifest.tensors) > bound:
        raise SizeLimitError(field="tensors", expected=f"<= {bound} entries", found=len(manifest.tensors))
    if manifest.total_bytes > limits.max_total_bytes:
        raise SizeLimitError(
            field="total_bytes", expected=f"<= {limits.max_total_bytes} ({limits.sized_by})", found=manifest.total_bytes
        )
    sizes = {s.key: s.bytes for s in manifest.shards}
    if len(sizes) != len(manifest.shards):
        raise ManifestError("a shard is listed twice", field="shards", found=[s.key for s in manifest.shards])
    seen: set[str] = set()
    total = 0
    for t in manifest.tensors:
        where = f"tensors[{t.name}]"
        if t.name in seen:
            raise TensorSpecError("duplicate tensor name", field=where)
        seen.add(t.name)
        itemsize = dtype_from_tag(t.dtype, f"{where}.dtype").itemsize
        require_shape(t.shape, f"{where}.shape", max_ndim=limits.max_ndim)
        want = math.prod(t.shape) * itemsize  # Python ints: cannot overflow
        if want > limits.max_total_bytes:
            raise SizeLimitError(field=f"{where}.shape", expected=f"<= {limits.max_total_bytes} bytes", found=want)
        if t.length != want:
            raise TensorSpecError(
                "byte length disagrees with dtype x shape",
                field=f"{where}.length",
                expected=want,
                found=t.length,
            )
        check_encoding(where, t, itemsize)
        require_in_shard(where, t.shard, t.offset, t.stored_length, sizes)
        total += t.length
    if total != manifest.total_bytes:
        raise TensorSpecError(field="total_bytes", expected=total, found=manifest.total_bytes)
    check_parts(manifest)


def read_manifest(
    store: Store,
    ref: CheckpointRef,
    *,
    expect_kind: CheckpointKind | None,
    options: CheckpointOptions | None = None,
    expand_index: bool = True,
    bounds: Callable[[Manifest], Limits] | None = None,
) -> Manifest:
    """Read and check a committed manifest: size, format, schema, kind, location, signature
    (when a key is configured: ``options`` defaults to the configured ones),
    layout and fingerprint.

    A v3 manifest is returned with every rank index read, checked and filled in (its
    ``tensors`` and ``shards``); ``expand_index=False`` returns the checked root alone, for a
    reader that then reads only the indexes it needs (``cairn.checkpoint.index.expand``).

    ``bounds``: the bounds sized by the run (``cairn.trainers.validate.run_bounds``: what its
    trainer declares, under the ceiling), applied to the layout in place of ``options.limits``."""
    options = resolve_options(options)
    raw = manifest_bytes(store, ref, options.limits)
    manifest = verify_manifest(raw, ref, expect_kind=expect_kind, options=options, bounds=bounds)
    if expand_index and manifest.indexes is not None:
        return expand(store, ref, manifest, workers=2 * options.max_workers)
    return manifest


def verify_manifest(
    raw: bytes,
    ref: CheckpointRef,
    *,
    expect_kind: CheckpointKind | None,
    options: CheckpointOptions,
    bounds: Callable[[Manifest], Limits] | None = None,
) -> Manifest:
    """The checks of ``read_manifest`` on bytes already read (the root alone): what a writer
    that hands these very bytes on (the local tier's upload) verifies first."""
    limits = options.limits
    manifest = parse_manifest(raw, str(ref), limits=limits)
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
    if options.signer is not None:
        options.signer.verify(manifest.signed_payload(), manifest.signature)
    _check_structure(manifest, limits if bounds is None else bounds(manifest))
    summary = None if manifest.indexes is None else index_summary(manifest.indexes)
    recomputed = CheckpointContent.of(manifest).fingerprint(
        index_of(manifest.tensors), parts_json(manifest.parts), summary
    )
    if recomputed != manifest.fingerprint:
        raise IntegrityError(
            "manifest content does not match its fingerprint (edited or corrupted)",
            field="fingerprint",
            expected=recomputed,
            found=manifest.fingerprint,
        )
    return manifest
