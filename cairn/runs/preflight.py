"""What a run needs of its store before its first step: that this process can write and commit
there (``require_writable``), and that the run id does not already name another config's
checkpoints (``require_same_config``). Each failure is one typed line, raised before any
update is computed, so a store that refuses writes never costs a training run."""

from __future__ import annotations

import uuid

from cairn.checkpoint.latest import latest_cursor
from cairn.checkpoint.layout import PROBE_MARK, run_prefix
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.validate import manifest_config
from cairn.config import TrainConfig
from cairn.errors import ConfigError, StorageError, StoreNotFoundError
from cairn.stores.base import Store
from cairn.trainers.loading import normalized_config

__all__ = ["PROBE_MARK", "require_same_config", "require_writable"]


def require_writable(store: Store, run_id: str) -> None:
    """List the run's prefix, then write, commit (create-if-absent) and delete a small object
    under it: the calls a run makes of its store (its latest checkpoint, then saves), so a
    missing bucket, a read-only directory, a store that refuses writes or links is refused now
    (``StoreNotFoundError``, or ``StorageError`` when the store failed and a retry may succeed).
    The listing comes first: some S3 servers create a missing bucket on the first write."""
    base = f"{run_prefix(run_id)}{PROBE_MARK}{uuid.uuid4().hex[:12]}"
    written, committed = f"{base}.object", f"{base}.commit"
    where = f"{store.url} cannot take run {run_id}'s checkpoints (checked before training)"
    body = b"cairn preflight probe: deleted at once\n"
    try:
        next(iter(store.list(run_prefix(run_id))), None)
        try:
            store.write_object(written, [body], size=len(body))
            store.put_if_absent(committed, body)
        finally:
            store.delete([written, committed])
    except StoreNotFoundError as exc:
        raise StoreNotFoundError(f"{where}: {exc}", field="store") from None
    except StorageError as exc:
        raise type(exc)(f"{where}: {exc}", field="store") from None


def require_same_config(store: Store, run_id: str, config: TrainConfig, options: CheckpointOptions) -> None:
    """Refuse to start ``run_id`` afresh with ``config`` when the store already holds checkpoints
    of that run id under another config: its commits would conflict with them (or interleave
    two runs under one id) only after the training they cost."""
    cursor = latest_cursor(store, run_id, options)
    if cursor is None:
        return
    latest = cursor.ref
    found = manifest_config(cursor.manifest)
    ours = normalized_config(config)
    same_trainer = found.trainer_path == ours.trainer_path  # only then is the found config's trainer ours to import
    if same_trainer and normalized_config(found).canonical_json() == ours.canonical_json():
        return
    theirs, mine = found.to_json(), ours.to_json()
    differs = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
    raise ConfigError(
        f"run {run_id!r} in {store.url} already holds checkpoints of another config (latest: step {latest.step}; "
        f"{', '.join(differs) or 'config'} differ): train under another run id (--run-id), or continue "
        f"from {latest} (--resume)",
        field="run_id",
    )
