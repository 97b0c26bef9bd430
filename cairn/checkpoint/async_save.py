"""Async save: snapshot now, persist in the background.

``save_async`` copies the state into a snapshot buffer before returning, so the trainer may
mutate its arrays right away without changing what is saved. Persisting happens on a
background thread; the returned handle is waited on. At most ``max_in_flight`` saves run per
run (default 1): a further call blocks until one finishes (backpressure). A failed background
save is never dropped: its handle raises, and the next ``save_async`` / ``wait`` / ``close``
raises it too. A failed save never commits a manifest, so it never advances ``latest``.
"""

from __future__ import annotations

import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

from cairn.checkpoint.commit import CommitResult
from cairn.checkpoint.manager import save_training
from cairn.checkpoint.options import CheckpointOptions
from cairn.errors import StorageError
from cairn.state import TrainState
from cairn.stores.base import Store

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
        max_in_flight: int = 1,
        options: CheckpointOptions | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.options = options or CheckpointOptions.from_env()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="cairn-async-save")
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
            snapshot = state.copy()  # the snapshot buffer: nothing aliases the trainer's arrays
        except BaseException:
            self._slots.release()
            raise

        def persist() -> CommitResult:
            try:
                return save_training(self.store, self.run_id, snapshot, options=self.options)
            except BaseException as exc:
                with self._lock:
                    self._failure = self._failure or exc
                raise
            finally:
                self._slots.release()

        handle = SaveHandle(self._pool.submit(persist), snapshot.step)
        with self._lock:
            self._handles = [h for h in self._handles if not h.done()] + [handle]
        return handle

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
