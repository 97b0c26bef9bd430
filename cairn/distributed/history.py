"""A gang's history segments: rank 0 writes them before the coordinated save, every rank reads
them on a coordinated load (``cairn.checkpoint.history``).

Every rank holds the same history (each update's loss and learning rate are agreed values), so
one writer suffices: rank 0 writes what is not durable yet and broadcasts the ref, which every
rank puts in the same content — the fingerprint does not depend on the world size. A failure on
rank 0 reaches every rank in that one broadcast, so all raise alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cairn.checkpoint.history import ValueCheck, read_history, remember, write_history
from cairn.checkpoint.manifest import HistoryRef
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.distributed.checkpoint import SaveOutcome, agree, failure_of
from cairn.distributed.comm import Comm
from cairn.errors import error_named
from cairn.stores.base import Store

__all__ = ["write_gang_history", "gang_history_committed", "read_gang_history"]


def write_gang_history(
    comm: Comm,
    store: Store,
    run_id: str,
    history: Mapping[str, Sequence[float]],
    options: CheckpointOptions,
    *,
    value_check: ValueCheck | None = None,
) -> HistoryRef:
    """Rank 0 writes the history's new segments (each checked by ``value_check`` first); every
    rank returns the same ref, or raises rank 0's failure."""
    report: dict[str, Any] | None = None
    if comm.rank == 0:
        try:
            ref = write_history(store, run_id, history, workers=options.max_workers, value_check=value_check)
            report = {"ref": ref.model_dump(mode="json")}
        except Exception as exc:  # broadcast below, then raised on every rank
            report = {"error": failure_of(exc)}
    report = comm.broadcast_json(report)
    if "error" in report:
        type_name, message = report["error"]
        raise error_named(type_name, message if comm.world == 1 else f"rank 0 of {comm.world}: save: {message}")
    return HistoryRef.model_validate(report["ref"])


def gang_history_committed(store: Store, run_id: str, step: int, ref: HistoryRef, outcome: SaveOutcome) -> None:
    """After a coordinated save at ``step``: ``ref``'s segments are durable for the next save if
    this save committed them; if another attempt's manifest won, its segments are not known here."""
    remember(store, run_id, ref if outcome.created else None, step)


def read_gang_history(
    comm: Comm,
    store: Store,
    ref: CheckpointRef,
    history: HistoryRef,
    options: CheckpointOptions,
    *,
    value_check: ValueCheck | None = None,
) -> dict[str, list[float]]:
    """Every rank reads and checks the whole history; the outcome is agreed."""
    failure: list[str] | None = None
    out: dict[str, list[float]] = {}
    try:
        out = read_history(
            store, ref.run_id, history, limits=options.limits, value_check=value_check, workers=options.max_workers
        )
    except Exception as exc:
        failure = failure_of(exc)
    agree(comm, failure, f"restore of {ref}")
    remember(store, ref.run_id, history, ref.step)
    return out
