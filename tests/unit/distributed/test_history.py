"""A gang's history (``cairn.distributed.history``): rank 0 writes the segments, every rank puts
the same ref in the content, so the same state has the same fingerprint at every world size and
whatever the save schedule; a gang's checkpoint restores bit-exactly with its history."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.options import CheckpointOptions
from cairn.session import TrainingSession
from cairn.stores import MemoryStore
from cairn.trainers.loading import load_trainer
from cairn.training.manager import load_training
from tests.conftest import dist_config

RUN = "hist"


class ThreadComm:
    """One of ``world`` in-process ranks (threads): every collective through one shared board."""

    def __init__(self, rank: int, world: int, board: list[Any], barrier: threading.Barrier) -> None:
        self.rank, self.world, self.board, self._barrier = rank, world, board, barrier

    def _gather(self, value: Any) -> list[Any]:
        self.board[self.rank] = value
        self._barrier.wait()
        out = list(self.board)
        self._barrier.wait()
        return out

    def exchange(self, send: np.ndarray, send_sizes: Any, recv_sizes: Any, out: np.ndarray | None = None) -> np.ndarray:
        offsets = np.cumsum([0, *send_sizes])
        pieces = self._gather([send[offsets[j] : offsets[j + 1]].copy() for j in range(self.world)])
        got = np.concatenate([pieces[r][self.rank] for r in range(self.world)])
        if out is None:
            return got
        out[:] = got
        return out

    def all_gather_float(self, value: float) -> list[float]:
        return [float(v) for v in self._gather(value)]

    def any(self, flag: bool) -> bool:
        return any(self._gather(flag))

    def all_gather_json(self, doc: Any) -> list[Any]:
        return [json.loads(json.dumps(d)) for d in self._gather(doc)]

    def broadcast_json(self, doc: Any) -> Any:
        return json.loads(json.dumps(self._gather(doc)[0]))

    def barrier(self) -> None:
        self._barrier.wait()


def gang_run(world: int, store: MemoryStore, steps: int, save_at: set[int]) -> list[str]:
    """``world`` thread ranks train ``steps`` updates from step 0, saving at ``save_at``;
    the fingerprints of the saves, in order."""
    config = dist_config()
    board: list[Any] = [None] * world
    barrier = threading.Barrier(world, timeout=60)
    out: list[list[str]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            comm = ThreadComm(r, world, board, barrier)
            engine = load_trainer(config).data_parallel(comm, RUN, store, CheckpointOptions())
            engine.start_fresh()
            for _ in range(steps):
                engine.step()
                assert engine.state is not None
                if engine.state.step in save_at:
                    out[r].append(engine.save().fingerprint)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(o == out[0] for o in out)
    return out[0]


def test_a_gang_saves_the_same_fingerprint_at_every_world_size_and_save_schedule() -> None:
    plain = TrainingSession.fresh(RUN, MemoryStore("plain"), dist_config())
    plain.run(12, checkpoint_every=4)
    assert plain.last_commit is not None
    want = plain.last_commit.manifest.fingerprint
    two = MemoryStore("two")
    assert gang_run(2, two, 12, {4, 8, 12})[-1] == want
    assert gang_run(1, MemoryStore("one"), 12, {12}) == [want]  # one save, not three: the same identity
    ref = list_checkpoints(two, RUN)[-1]
    restored, manifest = load_training(two, ref, trainer=load_trainer(dist_config()))
    assert manifest.history is not None and manifest.history.series["loss"].length == 12
    assert compare_states(restored, plain.state) == []
