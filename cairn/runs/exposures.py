"""The run's lifecycle record: reference snapshots for new stages, and final-test exposures.

**Stages.** A run may start a new stage from another run's checkpoint (``config.init_from``):
the new stage takes the reference's *weights* — a legitimate initialisation, not a resume (its
optimizer state, step, RNG and data position start fresh). The reference is validated like
any import, its fingerprint is recorded in the new lineage (``lineage.reference``), and the
stage contract is enforced: the new config may differ from the reference's only in the fields
``init_from.may_change`` lists (``stage`` and ``init_from`` always may).

**Final-test exposures.** Every evaluation on the held-out test split (``cairn eval --split
test``) is an exposure that weakens the test as an unbiased estimate. Exposures are appended to
the run's lifecycle log (``RUN/lifecycle/SEQ.json``, numbered create-if-absent objects) — the
checkpoints stay immutable. The count of a checkpoint is what its lineage inherited from its
reference plus the exposures logged for its run; from the second one on, Cairn warns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cairn.checkpoint.layout import lifecycle_key, lifecycle_prefix, sequence_number
from cairn.checkpoint.manager import load_training_with_trainer
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.validate import manifest_config
from cairn.config import BUILTIN_TRAINER
from cairn.errors import IncompatibleConfigError, StorageError, TensorSpecError
from cairn.state import Lineage, ReferenceSnapshot, TrainState
from cairn.stores import open_store
from cairn.stores.base import Store
from cairn.trainers.base import Trainer
from cairn.trainers.loading import trainer_for_checkpoint

__all__ = ["initial_state", "Exposure", "record_test_exposure", "logged_exposures", "exposure_count"]

ALWAYS_MAY_CHANGE = ("stage", "init_from")


def initial_state(trainer: Trainer, *, options: CheckpointOptions | None = None) -> TrainState:
    """Step 0 of a run: fresh, or — with ``init_from`` — a new stage on a reference's weights."""
    state = trainer.init_state()
    init = trainer.config.init_from
    if init is None:
        return state
    ref = CheckpointRef.parse(init.checkpoint)
    options = options or CheckpointOptions.from_env()
    source = open_store(ref.store_url)
    manifest = read_manifest(source, ref, expect_kind=CheckpointKind.TRAINING, options=options)
    ref_config = manifest_config(manifest)
    _check_stage_contract(trainer, ref_config.model_dump(mode="json"), init.may_change)
    ref_trainer = trainer_for_checkpoint(ref_config, trainer.config)  # the same factory: checked above
    ref_state, ref_manifest, _ = load_training_with_trainer(source, ref, trainer=ref_trainer, options=options)
    weights = {n: a for n, a in ref_state.tensors.items() if trainer.is_weight(n)}
    want = {n: a for n, a in state.tensors.items() if trainer.is_weight(n)}
    if set(weights) != set(want):
        raise TensorSpecError(
            "init_from: the reference's weights do not fit this model",
            field="init_from.checkpoint",
            expected=sorted(want)[:10],
            found=sorted(weights)[:10],
        )
    for name, arr in weights.items():
        if arr.shape != want[name].shape or arr.dtype != want[name].dtype:
            raise TensorSpecError(
                field=f"init_from: tensors[{name}]",
                expected=f"{want[name].dtype}{list(want[name].shape)}",
                found=f"{arr.dtype}{list(arr.shape)}",
            )
        state.tensors[name] = arr.copy()
    inherited = exposure_count(source, ref.run_id, ref_state.lineage)
    state.lineage = state.lineage.model_copy(
        update={
            "reference": ReferenceSnapshot(
                checkpoint=str(ref),
                fingerprint=ref_manifest.fingerprint,
                run_id=ref.run_id,
                step=ref.step,
                may_change=sorted({*init.may_change, *ALWAYS_MAY_CHANGE}),
            ),
            "final_test_exposures": inherited,
        }
    )
    return state


def _check_stage_contract(trainer: Trainer, reference: dict[str, Any], may_change: Sequence[str]) -> None:
    mine = trainer.config.model_dump(mode="json")
    ref_factory = (reference.get("trainer") or {}).get("factory") or BUILTIN_TRAINER
    if ref_factory != trainer.path:
        raise IncompatibleConfigError(
            'init_from: a stage keeps its reference\'s trainer ("trainer" in may_change allows its options to change)',
            field="config.trainer.factory",
            expected=ref_factory,
            found=trainer.path,
        )
    allowed = {*may_change, *ALWAYS_MAY_CHANGE}
    for name in sorted(mine):
        if name in allowed or mine[name] == reference.get(name):
            continue
        raise IncompatibleConfigError(
            "init_from: the stage contract does not allow this change relative to the reference "
            f"(add {name!r} to init_from.may_change if the new stage may change it)",
            field=f"config.{name}",
            expected=reference.get(name),
            found=mine[name],
        )


@dataclass(frozen=True)
class Exposure:
    seq: int
    checkpoint: str
    fingerprint: str
    step: int
    at: str
    metrics: dict[str, float]


def _entries(store: Store, run_id: str) -> list[tuple[int, str]]:
    """(number, key) of every entry in the run's lifecycle log (whatever the event), in order."""
    numbered = ((sequence_number(info.key), info.key) for info in store.list(lifecycle_prefix(run_id)))
    return sorted((seq, key) for seq, key in numbered if seq is not None)


def _exposures(store: Store, entries: list[tuple[int, str]]) -> list[Exposure]:
    out = []
    for seq, key in entries:
        try:
            body = json.loads(store.read(key)[: 1 << 16])
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
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a malformed entry is skipped
    return out


def logged_exposures(store: Store, run_id: str) -> list[Exposure]:
    """The run's logged final-test exposures, in order (malformed entries are skipped)."""
    return _exposures(store, _entries(store, run_id))


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
    for _ in range(16):
        entries = _entries(store, ref.run_id)
        logged = _exposures(store, entries)
        seq = max((n for n, _ in entries), default=0) + 1
        if store.put_if_absent(lifecycle_key(ref.run_id, seq), json.dumps(body).encode()):
            return (lineage.final_test_exposures if lineage is not None else 0) + len(logged) + 1
    raise StorageError(f"run {ref.run_id!r}: the lifecycle log kept changing; try again")
