"""Final-test exposures: every evaluation on the held-out test split weakens it as an unbiased
estimate, so each is appended to the run's lifecycle log (a numbered log; checkpoints stay
immutable). A checkpoint's count is what its lineage inherited plus its run's logged ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from cairn.checkpoint.layout import lifecycle_prefix
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import InvalidObjectError, StorageError
from cairn.state import Lineage
from cairn.stores.base import Store
from cairn.stores.numbered import NumberedLog
from cairn.stores.objects import read_record

__all__ = ["Exposure", "record_test_exposure", "logged_exposures", "exposure_count"]


@dataclass(frozen=True)
class Exposure:
    seq: int
    checkpoint: str
    fingerprint: str
    step: int
    at: str
    metrics: dict[str, float]


def _log(store: Store, run_id: str) -> NumberedLog:
    """The run's lifecycle log (whatever the event); its first entry is number 1."""
    return NumberedLog(store, lifecycle_prefix(run_id), first=1)


def _exposures(store: Store, entries: list[tuple[int, str]]) -> list[Exposure]:
    out = []
    for seq, key in entries:
        try:
            body = read_record(store, key, what="lifecycle event")
            if body.get("event") != "test-exposure":
                continue
            out.append(
                Exposure(
                    seq=seq,
                    checkpoint=str(body["checkpoint"]),
                    fingerprint=str(body["fingerprint"]),
                    step=int(body["step"]),
                    at=str(body["at"]),
                    metrics={k: float(v) for k, v in dict(body.get("metrics", {})).items()},
                )
            )
        except (InvalidObjectError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue  # a malformed entry is skipped
    return out


def logged_exposures(store: Store, run_id: str) -> list[Exposure]:
    """The run's logged final-test exposures, in order (malformed entries are skipped)."""
    return _exposures(store, _log(store, run_id).entries())


def exposure_count(store: Store, run_id: str, lineage: Lineage | None) -> int:
    """Exposures of a checkpoint's lineage: inherited from its reference plus its run's own."""
    inherited = lineage.final_test_exposures if lineage is not None else 0
    return inherited + len(logged_exposures(store, run_id))


def record_test_exposure(
    store: Store, ref: CheckpointRef, fingerprint: str, metrics: dict[str, float], lineage: Lineage | None
) -> int:
    """Append one final-test exposure to the run's lifecycle log; return the new count."""
    body = {
        "event": "test-exposure",
        "checkpoint": str(ref),
        "fingerprint": fingerprint,
        "step": ref.step,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "metrics": metrics,
    }
    log = _log(store, ref.run_id)
    for _ in range(16):
        entries = log.entries()
        logged = _exposures(store, entries)
        if log.try_append(entries, json.dumps(body).encode()) is not None:
            return (lineage.final_test_exposures if lineage is not None else 0) + len(logged) + 1
    raise StorageError(f"run {ref.run_id!r}: the lifecycle log kept changing; try again")
