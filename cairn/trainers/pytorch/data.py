"""The adapter's data: ``(x, y)`` pairs, map-style datasets and loaders over them, batched by
Cairn's seeded sampler (``Split``), or a resumable stream (``cairn.trainers.pytorch.streams``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate
from torch.utils.data import Dataset as TorchDataset

from cairn.checkpoint.tensors import dtype_tag
from cairn.errors import ConfigError
from cairn.trainers.pytorch.state_io import to_numpy
from cairn.trainers.pytorch.streams import Stream, is_stateful, pair, quiet_torchdata

__all__ = ["DataSplit", "Split", "as_tensor", "make_split", "splits_hash"]

DataSplit = tuple[Any, Any] | TorchDataset | DataLoader  # type: ignore[type-arg]


def as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


class Split:
    """A map-style data split with batch access by index array, and its content hash."""

    stream = False

    def __init__(self, data: Any, name: str, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.name = name
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.dataset: Any = None
        self.collate = collate or default_collate
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ConfigError(f"{name} data", expected="an (x, y) pair", found=f"a tuple of {len(data)}")
            x, y = as_tensor(data[0]), as_tensor(data[1])
            if x.shape[0] != y.shape[0]:
                raise ConfigError(f"{name} data", expected="x and y of equal length", found=(x.shape, y.shape))
            self.x, self.y = x, y
            self.n = int(x.shape[0])
        else:
            self.dataset = data
            self.n = len(data)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.x is not None and self.y is not None:
            index = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
            return self.x[index], self.y[index]
        return pair(self.collate([self.dataset[int(i)] for i in idx]), self.name)

    def eval_batches(self, size: int) -> Any:
        """The whole split in order, ``size`` examples at a time."""
        for start in range(0, self.n, size):
            yield self.batch(np.arange(start, min(start + size, self.n)))

    def content_hash(self, h: Any) -> None:
        h.update(f"{self.name}:{self.n}".encode())
        batches = [np.arange(s, min(s + 4096, self.n)) for s in range(0, self.n, 4096)]
        for idx in batches:
            for t in self.batch(idx):
                arr = to_numpy(t.contiguous())
                h.update(f"{dtype_tag(arr.dtype)}{arr.shape}".encode())
                h.update(arr.tobytes())


def make_split(data: Any, name: str, batch_size: int) -> Split | Stream:
    """What the user's ``TorchSetup`` split is, as the adapter reads it: a map-style split (an
    ``(x, y)`` pair, a dataset, or a ``DataLoader`` over one: its dataset and collate function,
    Cairn's seeded sampler in place of its own), or a stream (an ``IterableDataset`` or loader
    with ``state_dict``/``load_state_dict``, whose state rides in the checkpoint's cursor; an
    iterable loader of batches with them, such as ``records.RecordLoader``)."""
    if isinstance(data, tuple):
        return Split(data, name)
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            if not is_stateful(data):
                raise ConfigError(
                    f"{name} data",
                    expected="a loader with resumable state (torchdata's StatefulDataLoader) over an IterableDataset",
                    found=f"a {type(data).__name__} without state_dict()/load_state_dict()",
                )
            return Stream(data, name, batch_size, train=name == "train")
        if name == "train" and data.batch_size not in (None, batch_size):
            raise ConfigError(f"{name} data: DataLoader.batch_size", expected=batch_size, found=data.batch_size)
        return Split(data.dataset, name, collate=data.collate_fn)
    if isinstance(data, IterableDataset):
        if not is_stateful(data):
            raise ConfigError(
                f"{name} data",
                expected="an IterableDataset with state_dict()/load_state_dict() (torchdata's Stateful), "
                "or a map-style dataset",
                found=f"{type(data).__name__} without resumable state: a resume could not continue the stream",
            )
        from torchdata.stateful_dataloader import StatefulDataLoader

        with quiet_torchdata():
            loader = StatefulDataLoader(data, batch_size=batch_size, drop_last=True)
        return Stream(loader, name, batch_size, train=name == "train")
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return Split(data, name)
    if is_stateful(data) and hasattr(data, "__iter__"):  # a loader of its own (``records.RecordLoader``)
        return Stream(data, name, batch_size, train=name == "train")
    raise ConfigError(
        f"{name} data",
        expected="an (x, y) pair, a map-style dataset, a DataLoader or a stateful stream",
        found=type(data).__name__,
    )


def splits_hash(splits: Iterable[Split | Stream]) -> str:
    """The content hash of a run's data (a stream contributes its identity, not its content)."""
    hasher = hashlib.sha256()
    for split in splits:
        split.content_hash(hasher)
    return "sha256:" + hasher.hexdigest()
