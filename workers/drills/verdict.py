"""A drill's verdict: what must hold after any schedule of faults, checked against the truth.

``run``: the workflow completed; ``state``: the final checkpoint equals an uninterrupted in-process
run, field by field (bit for bit, or within the run's tolerance contract); ``effects``: by the
service's own records, one reservation, released, and one published entry, the final checkpoint;
``checkpoints``: every committed one validates against the run's own trainer, as a worker would
restore it (the trainer the run input names, trusted as the worker trusts it), and a refusal says
why; ``uncommitted``: partial uploads are collected and none remain; ``faults``: each fired and
training resumed, no kill (nor freeze) recomputed more than an interval, and no frozen worker's
attempt committed anything once thawed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cairn.checkpoint import (
    CheckpointKind,
    CheckpointRef,
    RetentionPolicy,
    collect_garbage,
    compare_states,
    list_checkpoints,
    plan_gc,
)
from cairn.config import TrainConfig
from cairn.effects import ReservationClient, published_entries
from cairn.session import TrainingSession
from cairn.stores import MemoryStore, open_store
from cairn.trainers import Trainer, load_trainer
from cairn.training import load_training

__all__ = ["Check", "judge"]


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    fields: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "fields": list(self.fields)}


def judge(result: Any, phase: Callable[[str, str], None] = lambda name, detail: None) -> list[Check]:
    """Every check of the verdict; a check that could not run fails and says why. ``phase`` is
    told what is checked now: the ``baseline`` (the uninterrupted run the final state is compared
    with, trained here), then each other check (``verifying``)."""
    checks = [_run(result)]
    steps = result.summary.get("steps") if result.summary else None
    effects = bool(result.extra.get("effects"))
    for fn, stage, detail in (
        (_state, "baseline", f"an uninterrupted in-process run to step {steps}, compared with the final checkpoint"),
        (_effects, "verifying", "exactly-once effects, by the service's records" if effects else ""),
        (_checkpoints, "verifying", "every committed checkpoint, restored as a worker would"),
        (_uncommitted, "verifying", "partial uploads collected"),
        (_faults, "verifying", "each fault fired and training resumed"),
    ):
        if detail:
            phase(stage, detail)
        try:
            check = fn(result)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
            name = fn.__name__.lstrip("_")
            check = Check(name, False, f"could not check: {type(exc).__name__}: {exc}")
        if check is not None:
            checks.append(check)
    return checks


TOLERANCE = (1e-5, 1e-8)
"""(rtol, atol) for runs that declare the tolerance contract (``lineage.reproducibility``)."""


def _run(result: Any) -> Check:
    ok = result.status == "COMPLETED" and result.summary is not None
    steps = result.summary["steps"] if result.summary else None
    return Check("run", ok, f"workflow {result.workflow_id} {result.status.lower()}, {steps} steps")


def _run_trainer(result: Any) -> Trainer:
    """The drilled run's trainer, from its input's config: what a worker builds to restore it."""
    return load_trainer(TrainConfig.model_validate(result.extra["config"]))


def _state(result: Any) -> Check:
    if not result.summary or not result.summary.get("checkpoint"):
        return Check("state", False, "no final checkpoint to compare")
    ref = CheckpointRef.parse(result.summary["checkpoint"])
    config = TrainConfig.model_validate(result.extra["config"])
    state, manifest = load_training(open_store(ref.store_url), ref, trainer=_run_trainer(result))
    reference = TrainingSession.fresh("reference", MemoryStore("drill-reference"), config)
    reference.run(state.step)
    tolerant = manifest.lineage is not None and manifest.lineage.reproducibility == "tolerance"
    rtol, atol = TOLERANCE if tolerant else (0.0, 0.0)
    diffs = compare_states(state, reference.state, rtol=rtol, atol=atol)
    if diffs:
        largest = max(diffs, key=lambda d: d.max_abs_diff or 0.0)
        worst = f"; largest |diff| {largest.max_abs_diff:.3g} in {largest.field}" if largest.max_abs_diff else ""
        return Check(
            "state",
            False,
            f"DIFFERENT from {state.step} uninterrupted in-process updates in {len(diffs)} field(s): "
            + ", ".join(d.field for d in diffs)
            + worst,
            tuple(d.field for d in diffs),
        )
    verdict = (
        f"EQUAL within rtol={rtol:g}, atol={atol:g} (the run's tolerance contract)" if tolerant else "BIT-IDENTICAL"
    )
    return Check(
        "state",
        True,
        f"{verdict} to {state.step} uninterrupted in-process updates "
        f"(every tensor, t, RNG, cursor, trainer state, history, config; {manifest.fingerprint[:19]})",
    )


def _effects(result: Any) -> Check | None:
    if not result.extra.get("effects"):
        return None
    service = ReservationClient(result.extra["service_url"])
    mine = [r for r in service.reservations() if r.get("run_id") == result.run_id]
    problems = []
    if len(mine) != 1:
        listed = ", ".join(f"{r['reservation_id']} {r['status']}" for r in mine)
        problems.append(f"{len(mine)} reservations for the run (expected 1): {listed}")
    held = sum(int(r["units"]) for r in mine if r.get("status") == "active")
    if held:
        problems.append(f"{held} unit(s) still consumed after the run (expected 0: released)")
    entries = published_entries(open_store(result.store), result.run_id)
    final = result.summary.get("checkpoint") if result.summary else None
    if len(entries) != 1 or entries[0].checkpoint != final:
        problems.append(f"{len(entries)} published entr(y/ies) (expected 1, the final checkpoint {final})")
    if problems:
        return Check("effects", False, "; ".join(problems), ("reservation",) if len(mine) != 1 else ())
    r = mine[0]
    return Check(
        "effects",
        True,
        f"exactly once: 1 reservation ({r['reservation_id']}, {r['units']} units, released), 1 published entry",
    )


def _checkpoints(result: Any) -> Check:
    store = open_store(result.store)
    refs = list_checkpoints(store, result.run_id, CheckpointKind.TRAINING)
    if not refs:
        return Check("checkpoints", False, "no committed checkpoint in the store")
    trainer = _run_trainer(result)
    refused: dict[str, list[int]] = {}  # the reason -> the steps refused for it
    for ref in refs:
        try:
            load_training(store, ref, trainer=trainer)
        except Exception as exc:  # noqa: BLE001 - each refusal is reported, with its reason
            refused.setdefault(f"{type(exc).__name__}: {exc}", []).append(ref.step)
    if refused:
        reasons = "; ".join(
            f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}: {why}" for why, steps in refused.items()
        )
        count = sum(len(steps) for steps in refused.values())
        return Check("checkpoints", False, f"{count} of {len(refs)} committed checkpoints refused: {reasons}")
    made = len({c.step for c in result.logs.commits})
    return Check(
        "checkpoints",
        True,
        f"all {len(refs)} kept checkpoints verify (steps {refs[0].step}..{refs[-1].step}; "
        f"{made} committed during the drill)",
    )


def _uncommitted(result: Any) -> Check:
    store = open_store(result.store)
    keep_all = RetentionPolicy(keep_last=1_000_000, grace_seconds=0.0)
    plan = collect_garbage(store, result.run_id, keep_all)
    after = plan_gc(store, result.run_id, keep_all)
    remaining = after.orphans + store.stale_uploads(f"{result.run_id}/", 0.0)
    found = len(plan.orphans) + len(plan.aborted_uploads)
    result.extra["orphans_collected"] = found
    if remaining:
        return Check("uncommitted", False, f"{len(remaining)} partial upload object(s) remain after collection")
    return Check(
        "uncommitted",
        True,
        f"no uncommitted checkpoint visible; {len(plan.orphans)} orphan shard(s) and "
        f"{len(plan.aborted_uploads)} incomplete upload(s) collected, none remain",
    )


def _faults(result: Any) -> Check:
    problems = []
    every = result.checkpoint_every
    for f in result.faults:
        if f.fired_at is None:
            problems.append(f"fault {f.index} ({f.kind}) did not fire: {f.note}")
        elif f.resumed_at is None:
            problems.append(f"fault {f.index} ({f.kind}): training did not resume")
        elif f.kind in ("worker-kill", "kill-in-upload", "freeze") and (f.recomputed or 0) > every:
            problems.append(f"fault {f.index} ({f.kind}) recomputed {f.recomputed} steps > interval {every}")
        if f.zombie_commits:
            steps = ", ".join(map(str, f.zombie_commits))
            problems.append(
                f"fault {f.index} ({f.kind}): the thawed worker's superseded attempt committed step(s) {steps}"
            )
    if problems:
        return Check("faults", False, "; ".join(problems))
    return Check("faults", True, f"all {len(result.faults)} faults fired and training resumed after each")
