"""A run's footing in its store: where the store is, which store it is, and who trains the run.

Three rules keep a run on one store and one writer:

1. **Store URLs are absolute.** A relative path resolves against each worker's working
   directory, so a run would silently split its checkpoints over several directories. A run
   input names an absolute path or ``s3://bucket/prefix``; ``cairn run start`` resolves a
   relative path once, against the starter's working directory (``resolve_store_url``).
2. **Every store has an identity** (``cairn.stores.identity``), written on first use by
   create-if-absent. A run records the identity it started on; an activity that opens a store
   with another identity (or none: another host's empty local directory) refuses with
   ``StoreIdentityError`` — several hosts need a shared (S3) store.
3. **One workflow per run id.** The run's owner record (the latest ``RUN/owners/SEQ.json``)
   names the workflow training it; every segment checks it before training. A second
   workflow with another id is refused with ``RunOwnershipError`` while the owner is still
   running; a closed or unknown owner is taken over (a run restarted after it was terminated
   continues from its latest checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from cairn.checkpoint.layout import owner_key, owners_prefix
from cairn.errors import ConfigError, InvalidObjectError, ObjectNotFoundError, RunOwnershipError, StoreIdentityError
from cairn.stores.base import Store
from cairn.stores.identity import store_identity
from cairn.stores.numbered import NumberedLog
from cairn.stores.objects import read_record

__all__ = [
    "OwnerRecord",
    "store_url_problem",
    "resolve_store_url",
    "require_store_identity",
    "owner_key",
    "read_owner",
    "claim_run",
    "require_run_owner",
]

log = logging.getLogger("cairn.runs")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SHARED_HINT = "several hosts need one shared store: use s3://bucket/prefix (or one shared filesystem path)"


def store_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a run's store (None when it can)."""
    if not url or not url.strip():
        return "expected an absolute path or s3://bucket/prefix, found an empty string"
    if url != url.strip() or any(c in url for c in "\0\n\r"):
        return f"expected no surrounding whitespace or control characters, found {url!r}"
    if url.startswith("s3://"):
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        if not _BUCKET.match(bucket):
            return f"expected s3://BUCKET[/prefix] with a valid bucket name, found {url!r}"
        return None
    if "://" in url and not url.startswith("file://"):
        return f"expected an absolute path or s3://bucket/prefix, found unsupported scheme in {url!r}"
    path = url.removeprefix("file://")
    if not os.path.isabs(path):
        return (
            f"expected an absolute path or s3://bucket/prefix, found relative path {url!r} "
            "(it would resolve differently on every worker; `cairn run start` resolves it for you)"
        )
    return None


def resolve_store_url(url: str, cwd: str | Path | None = None) -> str:
    """The run-input form of ``url``: relative paths resolved once, against ``cwd``."""
    if not url or not url.strip():
        raise ConfigError("store", expected="a directory path or s3://bucket/prefix", found=url)
    if "://" in url and not url.startswith("file://"):
        return url
    path = Path(url.removeprefix("file://")).expanduser()
    if not path.is_absolute():
        path = Path(cwd or os.getcwd()) / path
    return str(path.resolve())


def require_store_identity(store: Store, expected: str | None) -> None:
    """Refuse a store that is not the one the run started on (None: the run predates identities)."""
    if expected is None:
        return
    found = store_identity(store, create=False)
    if found != expected:
        where = f"on {os.uname().nodename}" if hasattr(os, "uname") else "here"
        raise StoreIdentityError(
            f"store {store.url} {where} is not the store this run started on ({_SHARED_HINT})",
            field="store",
            expected=f"store id {expected}",
            found=f"store id {found}" if found else "a store with no identity (another host's directory?)",
        )


@dataclass(frozen=True)
class OwnerRecord:
    run_id: str
    workflow_id: str
    store_id: str
    claimed_at: str


def _claims(store: Store, run_id: str) -> NumberedLog:
    """The run's claims: a numbered log, the latest names the owner."""
    return NumberedLog(store, owners_prefix(run_id))


def read_owner(store: Store, run_id: str) -> OwnerRecord | None:
    """The run's owner: its latest claim (None when nobody ever claimed the run)."""
    claims = _claims(store, run_id).entries()
    if not claims:
        return None
    try:
        body = read_record(store, claims[-1][1], what="owner claim")
    except (ObjectNotFoundError, InvalidObjectError) as exc:
        if not isinstance(exc, ObjectNotFoundError):
            log.warning("run %s: its latest owner claim is not one Cairn writes (%s): it names no owner", run_id, exc)
        return None  # a malformed record names no live owner; the next claim replaces it
    fields = {k: body.get(k) for k in ("run_id", "workflow_id", "store_id", "claimed_at")}
    if not all(isinstance(v, str) for v in fields.values()):
        log.warning("run %s: its latest owner claim is not one Cairn writes: it names no owner", run_id)
        return None
    return OwnerRecord(**fields)  # type: ignore[arg-type]


def claim_run(
    store: Store, run_id: str, workflow_id: str, store_id: str, *, owner_running: Callable[[str], bool]
) -> OwnerRecord:
    """Record ``workflow_id`` as the run's trainer, or refuse while another workflow still is.

    Claims are numbered objects created by create-if-absent (``RUN/owners/SEQ.json``); the
    latest is the owner. Taking over from a closed owner creates the next number, so of two
    workflows taking over at once exactly one wins; the other re-reads and is refused.
    """
    mine = OwnerRecord(run_id=run_id, workflow_id=workflow_id, store_id=store_id, claimed_at=_now())
    data = json.dumps(asdict(mine)).encode()
    log = _claims(store, run_id)
    for _ in range(8):
        claims = log.entries()
        current = read_owner(store, run_id) if claims else None
        if current is not None and current.workflow_id == workflow_id:
            return current  # a retry, or the same workflow after continue-as-new
        if current is not None and owner_running(current.workflow_id):
            raise RunOwnershipError(
                f"run {run_id!r} is being trained by workflow {current.workflow_id!r} (since {current.claimed_at}); "
                "two workflows on one run id would interleave its checkpoints: use another run_id, "
                "or stop that workflow first",
                field="run_id",
            )
        if log.try_append(claims, data) is not None:
            return mine
    raise RunOwnershipError(f"run {run_id!r}: the claim kept changing hands; try again", field="run_id")


def require_run_owner(store: Store, run_id: str, workflow_id: str) -> None:
    """Refuse to train a run whose latest claim names another workflow (it was taken over)."""
    owner = read_owner(store, run_id)
    if owner is not None and owner.workflow_id != workflow_id:
        raise RunOwnershipError(
            f"run {run_id!r} now belongs to workflow {owner.workflow_id!r} (claimed {owner.claimed_at}); "
            f"this workflow ({workflow_id!r}) stops instead of interleaving its checkpoints",
            field="run_id",
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
