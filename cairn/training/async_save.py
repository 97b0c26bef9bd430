"""Async save: snapshot now, persist in the background.

``save_async`` copies the state into a snapshot buffer before returning, so the trainer may
mutate its arrays right away without changing what is saved. The snapshot buffers (one per
save in flight) are allocated once and reused by later saves, and the copy runs in pieces on
several threads (numpy releases the GIL): the trainer is blocked for a memory copy at memory
bandwidth, not for page faults of fresh allocations. Persisting happens on a
background thread; the returned handle is waited on. At most ``max_in_flight`` saves run per
run (default 1): a further call blocks until one finishes (backpressure). A failed background
save is never dropped: its handle raises, and the next ``save_async`` / ``wait`` / ``close``
raises it too. A failed save never commits a manifest, so it never advances ``latest``.
"""

from __future__ import annotations

import copy
import os
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from cairn.checkpoint.commit import CommitResult
from cairn.checkpoint.options import CheckpointOptions
from cairn.errors import StorageError
from cairn.state import TrainState
from cairn.stores.base import Store
from cairn.training.manager import save_training

COPY_PIECE = 8 << 20
"""Bytes per piece of the snapshot copy (pieces are copied concurrently)."""
_Arrays = dict[str, np.ndarray]

__all__ = ["AsyncCheckpointer", "SaveHandle"]


class SaveHandle:
    """A background save in progress; ``result()`` returns its commit or raises its failure."""

    def __init__(self, future: Future[CommitResult], step: int) -> None:
        self._future = future
        self.step = step

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> CommitResult:
        return self._future.result(timeout)


class AsyncCheckpointer:
    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        options: CheckpointOptions,
        max_in_flight: int = 1,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.options = options
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="cairn-async-save")
        self._copiers = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="cairn-snapshot")
        self._spare: list[_Arrays] = []  # snapshot buffers of finished saves, reused
        self._handles: list[SaveHandle] = []
        self._failure: BaseException | None = None
        self._lock = threading.Lock()

    def _raise_failure(self) -> None:
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise StorageError(f"a background checkpoint save failed: {failure}") from failure

    def save_async(self, state: TrainState) -> SaveHandle:
        self._raise_failure()
        self._slots.acquire()  # backpressure: wait for a free slot before taking a snapshot
        self._raise_failure()
        try:
            buffers = self._snapshot_arrays(state)  # nothing aliases the trainer's arrays
            snapshot = TrainState(
                config=state.config,
                lineage=state.lineage,
                tensors=buffers,
                step=state.step,
                cursor=state.cursor,
                rng_state=copy.deepcopy(state.rng_state),
                history={k: list(v) for k, v in state.history.items()},
                meta=copy.deepcopy(state.meta),
            )
        except BaseException:
            self._slots.release()
            raise

        def persist() -> CommitResult:
            try:
                nbytes = sum(int(a.nbytes) for a in buffers.values())
                target = self.store.save_target(self.run_id, nbytes)  # a full local tier: the durable store
                return save_training(target, self.run_id, snapshot, options=self.options)
            except BaseException as exc:
                with self._lock:
                    self._failure = self._failure or exc
                raise
            finally:
                with self._lock:
                    self._spare.append(buffers)  # the save is over: its buffers may be reused
                self._slots.release()

        handle = SaveHandle(self._pool.submit(persist), snapshot.step)
        with self._lock:
            self._handles = [h for h in self._handles if not h.done()] + [handle]
        return handle

    def _snapshot_arrays(self, state: TrainState) -> _Arrays:
        """Copy every state tensor into a spare snapshot buffer of the same layout (or new
        ones), in pieces, concurrently."""
        source = state.tensors
        layout = _layout(source)
        with self._lock:
            spare = self._spare
            self._spare = []
        buffers = next((b for b in spare if _layout(b) == layout), None)  # others are dropped
        if buffers is None:
            buffers = {k: np.empty(a.shape, a.dtype) for k, a in source.items()}
        pieces = []
        for name, src in source.items():
            dst_flat, src_flat = buffers[name].reshape(-1), np.ascontiguousarray(src).reshape(-1)
            step = max(1, COPY_PIECE // max(1, src_flat.itemsize))
            pieces += [(dst_flat[i : i + step], src_flat[i : i + step]) for i in range(0, src_flat.size, step)]
        for done in [self._copiers.submit(np.copyto, dst, src) for dst, src in pieces]:
            done.result()
        return buffers

    def wait(self) -> None:
        """Block until every save in flight finished; raise the first failure."""
        with self._lock:
            handles = list(self._handles)
        futures.wait([h._future for h in handles])  # failures are recorded in _failure
        self._raise_failure()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            self._copiers.shutdown(wait=True)
            self._spare = []


def _layout(buffers: _Arrays) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (a.shape, a.dtype) for k, a in buffers.items()}
