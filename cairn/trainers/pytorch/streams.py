"""A resumable data stream: a loader whose position (``state_dict()``, the protocol of torchdata's
``StatefulDataLoader``) rides in the checkpoint's data cursor, so a resume continues the stream
exactly where the checkpoint left it."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from cairn.errors import ConfigError, InvariantError
from cairn.trainers.pytorch.state_io import from_json, json_kind, jsonable

__all__ = ["Stream", "is_stateful", "pair", "quiet_torchdata"]


def pair(batch: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A collated batch as its ``(inputs, targets)`` pair."""
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    found = f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, tuple | list) else type(batch).__name__
    raise ConfigError(f"{name} data batch", expected="an (inputs, targets) pair", found=found)


def is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


@contextmanager
def quiet_torchdata() -> Iterator[None]:
    """torchdata 0.11 warns on every new iterator about a deprecated torch call of its own."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*set_vital.*is deprecated", category=UserWarning)
        yield


class Stream:
    """One split read as a stream: ``next_batch`` draws the next batch of the run's stream (a
    finished pass starts the next one), ``state``/``load`` are its position as plain JSON."""

    stream = True

    def __init__(self, loader: Any, name: str, batch_size: int, *, train: bool) -> None:
        self.loader, self.name, self.batch_size, self.train = loader, name, batch_size, train
        self._iter: Iterator[Any] | None = None
        self.fresh = self.state()
        try:
            self.batches_per_pass: int | None = len(loader)
        except TypeError:
            self.batches_per_pass = None

    # -- position ----------------------------------------------------------------------------
    def state(self) -> Any:
        return jsonable(self.loader.state_dict(), f"{self.name} data: state_dict()", nonfinite=True)

    def load(self, state: Any) -> None:
        self._iter = None
        with quiet_torchdata():
            self.loader.load_state_dict(from_json(copy.deepcopy(state), f"{self.name} data state"))

    def check(self, step: int, data: Any) -> None:
        """A checkpoint's cursor for this stream: ``step`` batches drawn, and a loader state of
        the same form as this loader's own (the same fields, the same JSON kinds)."""
        if not isinstance(data, Mapping) or set(data) != {"stream", "batches"}:
            found = sorted(data) if isinstance(data, Mapping) else json_kind(data)
            raise InvariantError("data cursor", field="meta.data", expected=["batches", "stream"], found=found)
        if data["batches"] != step:
            raise InvariantError(
                "a stream's cursor counts one batch per update",
                field="meta.data.batches",
                expected=step,
                found=data["batches"],
            )
        _same_form(data["stream"], self.fresh, "meta.data.stream")
        check = getattr(self.loader, "check_state", None)
        if callable(check):  # a loader that knows its data refuses a state of other data, naming it
            check(data["stream"])

    # -- batches -------------------------------------------------------------------------------
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        for attempt in range(2):
            if self._iter is None:
                with quiet_torchdata():
                    self._iter = iter(self.loader)
            try:
                with quiet_torchdata():
                    batch = next(self._iter)
                break
            except StopIteration:
                self._iter = None  # the pass is over: the next starts
                if attempt:
                    raise ConfigError(
                        f"{self.name} data", expected="a stream that yields batches", found="none"
                    ) from None
        x, y = pair(batch, self.name)
        rows = x.shape[0] if isinstance(x, torch.Tensor) and x.ndim else None
        if self.train and rows != self.batch_size:
            raise ConfigError(
                f"{self.name} data: a batch of the stream (batch_size, drop_last=True)",
                expected=f"{self.batch_size} rows",
                found=rows,
            )
        return x, y

    def eval_batches(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One whole pass from the stream's start (the loader's own batch size)."""
        self.load(self.fresh)
        with quiet_torchdata():
            batches = iter(self.loader)
        while True:
            try:
                with quiet_torchdata():
                    batch = next(batches)
            except StopIteration:
                return
            yield pair(batch, self.name)

    def content_hash(self, h: Any) -> None:
        """A stream may be unbounded: its identity is its types and its starting state (plus the
        setup's ``data_version``), not its content — and the loader's ``fingerprint()`` when it
        has one (``RecordLoader``: its files' content hashes, at O(files) cost)."""
        dataset = getattr(self.loader, "dataset", self.loader)
        h.update(f"stream:{self.name}:{type(self.loader).__qualname__}:{type(dataset).__qualname__}".encode())
        h.update(repr(self.fresh).encode())
        fingerprint = getattr(self.loader, "fingerprint", None)
        if callable(fingerprint):
            h.update(f"fingerprint:{fingerprint()}".encode())


def _same_form(saved: Any, fresh: Any, field: str) -> None:
    if json_kind(saved) != json_kind(fresh) and fresh is not None and saved is not None:
        raise InvariantError(
            "loader state does not fit this data", field=field, expected=json_kind(fresh), found=json_kind(saved)
        )
    if isinstance(fresh, Mapping) and isinstance(saved, Mapping):
        if set(saved) != set(fresh):
            raise InvariantError(
                "loader state does not fit this data", field=field, expected=sorted(fresh), found=sorted(saved)
            )
        for key in fresh:
            _same_form(saved[key], fresh[key], f"{field}.{key}")
