"""The checkpoint half of every data-parallel engine: a gang's coordinated load and save of a
training state (``CoordinatedEngine``). It owns what every rank does alike; an engine (the
MLP's ZeRO-1, the PyTorch adapter's replicated one) supplies only its layout (``RankShare``:
the blocks this rank reads and writes, and how what it read becomes its state), and the run's
trainer its rules (``TrainingRules``).

Load: every rank reads the training manifest under the run's bounds and checks it against the
run's trainer and block size, then reads its own blocks (and, in a checkpoint written before
history segments, the history's blocks) and the history; each step's outcome is agreed before
anyone uses it. Save: every rank applies the trainer's value rules to the blocks it writes (a
non-finite value is a diverged run), agreed; then the history segments, the coordinated save
(``cairn.distributed.checkpoint``), and the checkpoint becomes the state's lineage parent.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import numpy as np

from cairn.checkpoint.blocks import base_name, block_elems_for, logical_specs, split_blocks
from cairn.checkpoint.manifest import CheckpointKind, Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions, Limits
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.training import is_history, split_history, training_content, training_state
from cairn.config import TrainConfig
from cairn.distributed.checkpoint import SaveOutcome, agree, coordinated_save, failure_of, read_blocks
from cairn.distributed.comm import Comm
from cairn.distributed.history import gang_history_committed, read_gang_history, write_gang_history
from cairn.errors import ConfigError, InvariantError, ManifestError, NonFiniteError, TrainingDivergedError
from cairn.state import TrainState
from cairn.stores.base import Store

__all__ = ["CoordinatedEngine", "RankShare", "TrainingRules", "check_blocked", "whole_buffers"]


class TrainingRules(Protocol):
    """What the engine asks of the run's trainer (``cairn.trainers.validate.RunRules`` is one)."""

    @property
    def config(self) -> TrainConfig:
        """The run's config (a restored state carries it)."""

    def bounds(self, manifest: Manifest, ceiling: Limits) -> Limits:
        """The bounds a training checkpoint at the manifest's step is read under."""

    def check_manifest(self, manifest: Manifest) -> None:
        """Every metadata rule, before any tensor bytes are read."""

    def check_values(self, name: str, values: np.ndarray) -> None:
        """The value rules for (a block of) tensor ``name``: finite, and the trainer's own."""


class RankShare(Protocol):
    """One rank's share of the state, as its engine lays it out."""

    def blocks_to_read(self, manifest: Manifest) -> dict[str, np.ndarray]:
        """Block entry name -> this rank's buffer for it: the blocks of the state's tensors that
        this rank holds (the history is the engine's)."""

    def tensors_read(self) -> dict[str, np.ndarray]:
        """The state's tensors, by name, once every rank's read passed (every rank calls it:
        collectives allowed)."""

    def install(self, state: TrainState) -> None:
        """Adopt a restored state (an engine may refuse it: the outcome is agreed)."""

    def parts(self) -> dict[str, PartSpec]:
        """The checkpoint's blocked layout: exactly what a single writer of the same state writes."""

    def my_blocks(self) -> dict[str, np.ndarray]:
        """The blocks this rank writes (views of the live state)."""


def check_blocked(manifest: Manifest, block_bytes: int) -> None:
    """A distributed run restores blocked checkpoints (format v2 or v3) cut at its own block size."""
    if manifest.parts is None:
        raise ManifestError(
            "a distributed run restores only blocked checkpoints", field="format_version", expected=[2, 3], found=1
        )
    for name, (dtype, _) in logical_specs(manifest).items():
        want = block_elems_for(dtype, block_bytes)
        if manifest.parts[name].block_elems != want:
            raise InvariantError(
                "block size differs from the run's distributed.block_bytes",
                field=f"parts[{name}].block_elems",
                expected=want,
                found=manifest.parts[name].block_elems,
            )


def whole_buffers(
    manifest: Manifest, *, history: bool, exclude: Collection[str] = ()
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Uninitialised whole arrays for a blocked checkpoint's history (or for its state's tensors,
    but those named in ``exclude``), and the views of their blocks that a read fills (block entry
    name -> view)."""
    assert manifest.parts is not None
    specs = logical_specs(manifest)
    arrays = {
        name: np.empty(shape, dtype=dtype)
        for name, (dtype, shape) in specs.items()
        if is_history(name) == history and name not in exclude
    }
    return arrays, split_blocks(arrays, {name: manifest.parts[name] for name in arrays})


class CoordinatedEngine:
    """A gang rank's coordinated checkpoints of one run (every rank calls each method, in the
    same order); see the module."""

    def __init__(self, rules: TrainingRules, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> None:
        distributed = rules.config.distributed
        if distributed is None:
            raise ConfigError("distributed", expected="a trainer with a 'distributed' section", found=None)
        self.rules, self.comm, self.run_id, self.store, self.options = rules, comm, run_id, store, options
        self.block_bytes = distributed.block_bytes

    def load(self, ref: CheckpointRef, share: RankShare) -> Manifest:
        """Restore ``ref`` into ``share`` (checked, read and installed on every rank, agreed)."""
        manifest = self._checked_manifest(ref)
        history_arrays, history_blocks = whole_buffers(manifest, history=True)
        targets = {**share.blocks_to_read(manifest), **history_blocks}
        check = self.rules.check_values
        read_blocks(self.comm, self.store, ref, manifest, targets, value_check=check, options=self.options)
        tensors = share.tensors_read()
        _, history = split_history(history_arrays)  # a checkpoint written before history segments
        if manifest.history is not None:
            history = read_gang_history(self.comm, self.store, ref, manifest.history, self.options, value_check=check)
        failure: list[str] | None = None
        try:
            share.install(training_state(self.rules.config, manifest, tensors, history))
        except Exception as exc:
            failure = failure_of(exc)
        agree(self.comm, failure, f"restore of {ref}")
        return manifest

    def _checked_manifest(self, ref: CheckpointRef) -> Manifest:
        """The training manifest of ``ref``, read under the run's bounds and checked against the
        run's trainer and block size on every rank; the outcome agreed."""
        failure: list[str] | None = None
        manifest: Manifest | None = None
        try:
            manifest = read_manifest(
                self.store,
                ref,
                expect_kind=CheckpointKind.TRAINING,
                options=self.options,
                expand_index=False,
                bounds=lambda m: self.rules.bounds(m, self.options.limits),
            )
            self.rules.check_manifest(manifest)
            check_blocked(manifest, self.block_bytes)
        except Exception as exc:
            failure = failure_of(exc)
        agree(self.comm, failure, f"restore of {ref}")
        assert manifest is not None
        return manifest

    def save(self, state: TrainState, share: RankShare) -> SaveOutcome:
        """A coordinated checkpoint of ``state`` (every rank calls it). Each rank first applies the
        trainer's value rules to its own blocks: a state a restore would refuse is not written
        (a non-finite one is a diverged run)."""
        mine = share.my_blocks()
        failure: list[str] | None = None
        try:
            for name, values in mine.items():
                self.rules.check_values(base_name(name), values)
        except NonFiniteError as exc:
            failure = [TrainingDivergedError.__name__, f"step {state.step}: {exc}; nothing was committed"]
        except Exception as exc:
            failure = failure_of(exc)
        agree(self.comm, failure, "save")
        check = self.rules.check_values
        history = write_gang_history(self.comm, self.store, self.run_id, state.history, self.options, value_check=check)
        content = training_content(self.run_id, state, history)
        saved = coordinated_save(self.comm, self.store, content, mine, share.parts(), self.options)
        if self.comm.rank == 0:
            gang_history_committed(self.store, self.run_id, state.step, history, saved)
        state.lineage = state.lineage.model_copy(update={"parent": saved.fingerprint})  # provenance
        return saved
