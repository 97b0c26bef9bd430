"""A training session: one run's live state, its dataset, and the store it checkpoints to.

The CLI and the Temporal activities both drive training through this class. Its state is
replaced only by a checkpoint that passed every validation rule; a refused import raises a
``CheckpointError`` and leaves the session exactly as it was.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

from cairn.checkpoint.commit import CommitResult
from cairn.checkpoint.latest import latest_committed
from cairn.checkpoint.layout import RUN_ID_PATTERN
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.ref import CheckpointRef
from cairn.config import TrainConfig
from cairn.errors import ConfigError, NonFiniteError, TrainerCodeError, TrainingDivergedError
from cairn.numerics import process_numerics, resumed_numerics
from cairn.state import Lineage, StepCallback, TrainState
from cairn.stores import open_store
from cairn.stores.base import Store
from cairn.trainers.base import Trainer, check_finite
from cairn.trainers.loading import load_trainer
from cairn.trainers.stages import initial_state
from cairn.training.async_save import AsyncCheckpointer, SaveHandle
from cairn.training.manager import load_training, load_training_with_trainer, save_training

__all__ = [
    "TrainingSession",
    "default_run_id",
    "MAX_STEPS",
    "require_finite",
    "state_bytes",
    "with_process_numerics",
]

MAX_STEPS = 100_000_000
"""The most updates one command or run may ask for (the loss/lr history is held in memory and
in the run's history segments at 16 bytes per step: 1.6 GB at this bound)."""

CheckpointHook = Callable[[CommitResult], None]


def default_run_id(config: TrainConfig) -> str:
    """A stable run id derived from the config: the same config names the same run."""
    return "cfg-" + hashlib.sha256(config.canonical_json().encode()).hexdigest()[:12]


def _as_store(store: Store | str | os.PathLike[str]) -> Store:
    return store if isinstance(store, Store) else open_store(os.fspath(store))


def _edge_options(kw: dict[str, Any]) -> CheckpointOptions:
    """A constructor's options: the caller's, or the configured ones read here (a constructor
    is an edge); put back in ``kw`` so the session is built with this same object."""
    kw["options"] = options = resolve_options(kw.get("options"))
    return options


def _check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise ConfigError("run_id", expected=RUN_ID_PATTERN.pattern, found=run_id)
    return run_id


def require_finite(state: TrainState, last_commit: CommitResult | None = None, *, arrays: bool = True) -> None:
    """Refuse a diverged state (NaN/inf loss, or any float tensor) before it can be committed.

    The loss is checked after every update (one float); the arrays before every commit.
    """
    last = state.last("loss")
    loss = 0.0 if last is None else last
    bad = None if math.isfinite(loss) else "loss"
    if bad is None and arrays:
        for name, arr in state.tensors.items():
            try:
                check_finite(name, arr)  # every float dtype, bfloat16 included
            except NonFiniteError:
                bad = name
                break
    if bad is not None:
        since = f"last committed checkpoint: {last_commit.ref}" if last_commit else "no checkpoint was committed"
        raise TrainingDivergedError(
            f"training diverged at step {state.step}: {bad} is not finite (loss {loss!r}); nothing was "
            f"committed at this step; {since} (lower the learning rate or check the data)",
            field=bad,
        )


def state_bytes(state: TrainState) -> int:
    """About the bytes a checkpoint of ``state`` writes (its tensors and history)."""
    return sum(int(a.nbytes) for a in state.tensors.values()) + 8 * sum(len(v) for v in state.history.values())


def with_process_numerics(state: TrainState, trainer: Trainer, where: str, tolerate: bool = False) -> Lineage:
    """``state``'s lineage, stamped with the numerics profile this process computes under; a
    bit-exact state computed under another profile is refused (``ProfileMismatchError``) unless
    ``tolerate`` (or the trainer's tolerance contract) allows mixing."""
    exact = trainer.reproducibility == "bit-exact" and not tolerate
    record = resumed_numerics(state.lineage.numerics, process_numerics(), exact=exact, where=where)
    return state.lineage.model_copy(update={"numerics": record})


class TrainingSession:
    def __init__(
        self,
        run_id: str,
        store: Store,
        state: TrainState,
        trainer: Trainer,
        *,
        options: CheckpointOptions | None = None,
        tolerate_numerics: bool = False,
    ) -> None:
        self.run_id = _check_run_id(run_id)
        self.store = store
        self.state = state
        self.trainer = trainer
        self.options = resolve_options(options)
        """Signer, limits and shard settings for every save and restore of this session (given,
        or the configured ones, read once here)."""
        self.tolerate_numerics = tolerate_numerics
        """Resume a bit-exact run's checkpoint under another numerics profile (``--tolerance``):
        the lineage records both profiles (``numerics.mixed``)."""
        self.last_commit: CommitResult | None = None
        self.restored_from: CheckpointRef | None = None
        self._stamped: TrainState | None = None
        """The state whose lineage carries this process's numerics (stamped once: ``_adopt``)."""
        self.saves = 0
        self.blocked_seconds = 0.0
        """Checkpoints the last ``run`` committed and the seconds they blocked training (a sync
        save whole; an async one its snapshot and any wait for the save before it)."""

    # -- construction -------------------------------------------------------------------
    @classmethod
    def fresh(
        cls, run_id: str, store: Store | str | os.PathLike[str], config: TrainConfig, **kw: Any
    ) -> TrainingSession:
        """Step 0 of a run (or, with ``config.init_from``, a new stage from a reference's weights)."""
        store = _as_store(store)
        trainer = load_trainer(config)
        options = _edge_options(kw)
        return cls(run_id, store, initial_state(trainer, options=options), trainer, **kw)

    @classmethod
    def from_checkpoint(
        cls,
        ref: CheckpointRef,
        *,
        run_id: str | None = None,
        store: Store | str | os.PathLike[str] | None = None,
        config: TrainConfig | None = None,
        weights_only_restore: bool = False,
        **kw: Any,
    ) -> TrainingSession:
        """Resume from ``ref`` (validated); checkpoints go to ``store`` (default: ref's store).

        Without ``config`` the checkpoint's own config is used, and its trainer is imported
        only if trusted (``cairn.trainers.trainer_for_checkpoint``).
        """
        source = open_store(ref.store_url)
        target = source if store is None else _as_store(store)
        options = _edge_options(kw)
        trainer = load_trainer(config) if config is not None else None
        state, _, trainer = load_training_with_trainer(source, ref, trainer=trainer, options=options)
        if weights_only_restore:
            state = trainer.weights_only(state)  # a fresh start: computed under this process's profile
        session = cls(run_id or ref.run_id, target, state, trainer, **kw)
        if not weights_only_restore:
            session._adopt(state, str(ref))
        return session

    @classmethod
    def resume_latest(
        cls, run_id: str, store: Store | str | os.PathLike[str], config: TrainConfig, **kw: Any
    ) -> TrainingSession:
        """Continue from the run's last durable cursor, or start fresh when it has none."""
        store = _as_store(store)
        ref = latest_committed(store, run_id, options=_edge_options(kw))
        if ref is None:
            return cls.fresh(run_id, store, config, **kw)
        trainer = load_trainer(config)
        session = cls(run_id, store, trainer.init_state(), trainer, **kw)
        session.restore(ref)
        return session

    @property
    def checkpoint_options(self) -> CheckpointOptions:
        return self.options

    # -- state replacement --------------------------------------------------------------
    def restore(self, ref: CheckpointRef) -> None:
        """Replace this session's state with ``ref``'s, only if it passes validation."""
        source = self.store if ref.store_url == self.store.url else open_store(ref.store_url)
        state, _ = load_training(source, ref, trainer=self.trainer, options=self.checkpoint_options)
        self._adopt(state, str(ref))
        self.restored_from = ref

    def _adopt(self, state: TrainState, where: str) -> None:
        """Make ``state`` this session's, stamped with this process's numerics (``where`` names it
        in a refusal, raised before anything changes)."""
        state.lineage = with_process_numerics(state, self.trainer, where, self.tolerate_numerics)
        self.state = self._stamped = state

    def checkpoint(self) -> CommitResult:
        """Commit the current state (idempotent per step); a diverged state is refused."""
        require_finite(self.state, self.last_commit)
        result = save_training(self._save_target(self.state), self.run_id, self.state, options=self.checkpoint_options)
        self._committed(self.state, result)
        return result

    def _save_target(self, state: TrainState) -> Store:
        """Where the next save goes (``Store.save_target``: a local tier, or its durable store)."""
        return self.store.save_target(self.run_id, state_bytes(state))

    @property
    def durable_ref(self) -> CheckpointRef | None:
        """The checkpoint the current state last committed to or was restored from."""
        return self.last_commit.ref if self.last_commit is not None else self.restored_from

    def _committed(self, state: TrainState, result: CommitResult) -> None:
        state.lineage = state.lineage.model_copy(update={"parent": result.manifest.fingerprint})
        self.last_commit = result

    def _commit_trained(self, exc: TrainerCodeError, on_checkpoint: CheckpointHook | None) -> None:
        """The trainer's code failed after whole updates it kept (an evaluation raised): commit
        them, so the failure costs no training, and say so in the error."""
        trained = exc.trained
        committed = self.last_commit.manifest.step if self.last_commit is not None else self.state.step
        if not isinstance(trained, TrainState) or trained.step <= committed:
            return
        require_finite(trained, self.last_commit)
        self.state = trained
        result = self.checkpoint()
        if on_checkpoint:
            on_checkpoint(result)
        exc.args = (f"{exc.args[0] if exc.args else exc}; the updates before it were committed at step {trained.step}",)

    # -- training -----------------------------------------------------------------------
    def run(
        self,
        steps: int,
        *,
        checkpoint_every: int | None = None,
        async_save: bool = False,
        on_step: StepCallback | None = None,
        on_checkpoint: CheckpointHook | None = None,
        checkpoint_at_end: bool = True,
    ) -> CommitResult | None:
        """Train ``steps`` more updates, committing every ``checkpoint_every`` steps and at the end.

        With ``async_save`` the periodic checkpoints are snapshotted and persisted in the
        background (one in flight; the next waits for it). ``on_step`` may return True to stop
        early (graceful stop: the end checkpoint still happens). Returns the last commit.
        """
        if checkpoint_every is not None and checkpoint_every <= 0:
            raise ConfigError("checkpoint_every", expected="> 0", found=checkpoint_every)
        if self.state is not self._stamped:  # a state given, not restored: stamp it before it trains on
            self._adopt(self.state, str(self.durable_ref) if self.durable_ref else "this state")
        saver = AsyncCheckpointer(self.store, self.run_id, options=self.checkpoint_options) if async_save else None
        pending: SaveHandle | None = None
        self.saves, self.blocked_seconds = 0, 0.0  # what this call's checkpoints cost the trainer

        def settle(work: TrainState) -> None:
            nonlocal pending
            if pending is not None:
                result = pending.result()
                pending = None
                self._committed(work, result)
                if on_checkpoint:
                    on_checkpoint(result)

        def step_hook(work: TrainState) -> bool:
            nonlocal pending
            require_finite(work, self.last_commit, arrays=False)
            if checkpoint_every and work.step % checkpoint_every == 0:
                blocked = time.perf_counter()
                self.saves += 1
                require_finite(work, self.last_commit)
                if saver is None:
                    result = save_training(self._save_target(work), self.run_id, work, options=self.checkpoint_options)
                    self._committed(work, result)
                    if on_checkpoint:
                        on_checkpoint(result)
                else:
                    settle(work)  # the previous save's fingerprint becomes this one's parent
                    pending = saver.save_async(work)
                self.blocked_seconds += time.perf_counter() - blocked
            return bool(on_step is not None and on_step(work))

        try:
            self.state = self._stamped = self.trainer.train(self.state, steps, on_step=step_hook)
            waited = time.perf_counter()
            settle(self.state)  # the wait for the last background save is a checkpoint's cost too
            self.blocked_seconds += time.perf_counter() - waited
        except TrainerCodeError as exc:
            if saver is not None:
                saver.close()
                saver = None
            self._commit_trained(exc, on_checkpoint)
            raise
        finally:
            if saver is not None:
                saver.close()
        last = self.last_commit
        if checkpoint_at_end and (last is None or last.manifest.step != self.state.step):
            blocked = time.perf_counter()
            last = self.checkpoint()
            self.saves, self.blocked_seconds = self.saves + 1, self.blocked_seconds + time.perf_counter() - blocked
            if on_checkpoint:
                on_checkpoint(last)
        return last
