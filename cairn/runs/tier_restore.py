"""Where a segment resumes from when its worker has a node-local tier (``cairn.checkpoint.tier``).

The rules (also in the README, "A fast local tier"):

- the candidate is the run's newest local commit, if it is at or past the durable latest;
  at the durable latest's step it must be the same checkpoint (equal fingerprints: the same
  tensor checksums), past it it is a newer commit of the run checked against its own manifest;
- the candidate is restored from the local copy alone, every block checksum verified as on
  every read; if that fails (``CheckpointError``: a checksum, a bad manifest, another config;
  a missing or unreadable local object) the local copy is discarded and the durable latest is
  restored (or the run starts fresh) — never a mix of local and durable bytes for one state;
- otherwise (no local commit, or an older one) the durable latest is restored;
- local copies are used only while the durable store is the one they were made for (its
  identity, checked here: another one discards them), and, when the durable store holds no
  checkpoint of the run, only if that identity is recorded (not a store without one);
- a run whose upload lost a conflict never uses its local commits: its restore raises
  ``CheckpointConflictError``, as the conflicting commit would without a tier.
"""

from __future__ import annotations

import logging
from typing import Literal

from cairn.checkpoint.latest import latest_cursor
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tier import TieredStore
from cairn.config import TrainConfig
from cairn.errors import CheckpointError, InvalidObjectError, StorageError
from cairn.session import TrainingSession
from cairn.stores.base import Store
from cairn.trainers.loading import load_trainer

__all__ = ["RestoreSource", "local_candidate", "resume_tiered"]

log = logging.getLogger("cairn.tier")

RestoreSource = Literal["local", "durable", "fresh"]


def local_candidate(
    tiered: TieredStore, durable: Store, run_id: str, options: CheckpointOptions
) -> CheckpointRef | None:
    """The local commit a segment of ``run_id`` may resume from (see the module), or None.
    A local commit at the durable latest's step with other content is discarded here."""
    if run_id in tiered.conflicts or not tiered.check_identity():
        return None
    newest = tiered.newest(run_id)
    if newest is None:
        return None
    latest = latest_cursor(durable, run_id, options)
    if latest is None and tiered.identity is None:
        return None  # nothing durable, and nothing ties the local copy to this store
    if latest is not None and newest.ref.step < latest.ref.step:
        return None
    if latest is not None and newest.ref.step == latest.ref.step and latest.fingerprint != newest.fingerprint:
        tiered.discard(newest.ref, f"another checkpoint than the durable commit ({latest.fingerprint[:19]})")
        return None
    return newest.ref


def resume_tiered(
    run_id: str, tiered: TieredStore, durable: Store, config: TrainConfig, *, options: CheckpointOptions
) -> tuple[TrainingSession, RestoreSource]:
    """The run's session, restored under the rules above, writing through ``tiered``; and
    where its state came from."""
    tiered.require_no_conflict(run_id)
    candidate = local_candidate(tiered, durable, run_id, options)
    if candidate is not None:
        trainer = load_trainer(config)
        session = TrainingSession(run_id, tiered, trainer.init_state(), trainer, options=options)
        try:
            session.restore(candidate)  # reads the local copy only: tiered's reads are local
            log.info("run %s: restored step %d from the local tier %s", run_id, candidate.step, tiered.local.url)
            return session, "local"
        except (CheckpointError, InvalidObjectError, StorageError) as exc:
            tiered.discard(candidate, f"failed verification on restore: {type(exc).__name__}: {exc}")
    session = TrainingSession.resume_latest(run_id, durable, config, options=options)
    session.store = tiered
    if session.restored_from is None:
        return session, "fresh"
    log.info("run %s: restored step %d from the durable store %s", run_id, session.state.step, durable.url)
    return session, "durable"
