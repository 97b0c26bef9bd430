"""Where a segment's state comes from: the one choice between this worker's memory (warm), a
rollback's checkpoint, a node-local tier and the durable store's latest commit (cold), or step 0.

- memory: only on a first attempt with no rollback, and only when the held session is exactly
  the run's newest commit (the durable latest, or a newer local commit not uploaded yet): after
  a failure only the stores are trusted (``cairn.runs.warm``);
- a rollback restores the checkpoint it names, from the durable store;
- with a node-local tier, the rules of ``cairn.runs.tier_restore``;
- else the durable latest, or a fresh start when the run has none.

A segment never resumes past its target (``require_not_past``), whichever way it runs.
"""

from __future__ import annotations

import logging
from typing import Literal

from cairn.checkpoint.latest import latest_cursor
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tier import TieredStore
from cairn.config import TrainConfig
from cairn.errors import InvariantError
from cairn.runs.tier_restore import resume_tiered
from cairn.runs.warm import WarmRun
from cairn.session import TrainingSession
from cairn.stores.base import Store

__all__ = ["RestoreSource", "choose_restore", "require_not_past"]

log = logging.getLogger("cairn.runs")

RestoreSource = Literal["memory", "local", "durable", "fresh"]


def choose_restore(
    run_id: str,
    config: TrainConfig,
    store: Store,
    options: CheckpointOptions,
    *,
    tiered: TieredStore | None = None,
    resume_from: str | None = None,
    held: WarmRun | None = None,
    first_attempt: bool = True,
) -> tuple[TrainingSession, RestoreSource]:
    """The segment's session, writing through ``tiered`` when there is one, and where its state
    came from (see the module). ``held``: the session this worker kept for the run, if any."""
    if held is not None and resume_from is None and first_attempt:
        if held.matches(*_newest_commit(run_id, store, tiered, options)):
            held.session.store = tiered or store
            return held.session, "memory"
        log.info("run %s: the state held in memory is not the latest commit: restoring", run_id)
    if resume_from is not None:  # a rollback: this older checkpoint, not the latest
        session = TrainingSession.fresh(run_id, store, config, options=options)
        session.restore(CheckpointRef.parse(resume_from))
        session.store = tiered or store
        return session, "durable"
    if tiered is not None:
        return resume_tiered(run_id, tiered, store, config, options=options)
    session = TrainingSession.resume_latest(run_id, store, config, options=options)
    return session, "durable" if session.restored_from is not None else "fresh"


def _newest_commit(
    run_id: str, store: Store, tiered: TieredStore | None, options: CheckpointOptions
) -> tuple[int | None, str | None]:
    """The step and fingerprint of the run's newest commit: the durable latest, or a newer one
    this node's tier committed and has not uploaded yet."""
    latest = latest_cursor(store, run_id, options)
    newest = tiered.newest(run_id) if tiered is not None else None
    if newest is not None and (latest is None or newest.ref.step > latest.ref.step):
        return newest.ref.step, newest.fingerprint
    return (None, None) if latest is None else (latest.ref.step, latest.fingerprint)


def require_not_past(resumed: int, target: int) -> None:
    """Refuse a segment whose run is already committed past the step it was asked to reach."""
    if resumed > target:
        raise InvariantError(f"latest committed step {resumed} is past this segment's target {target}")
