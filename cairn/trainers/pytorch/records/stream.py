"""The record stream as the adapter trains on it: ``RecordStream`` (an ``IterableDataset`` of
whole batches, lane by lane, with torchdata's ``state_dict``/``load_state_dict``) and
``RecordLoader`` (its ``StatefulDataLoader``, worker processes included, plus the files'
fingerprint: its state carries the files' digests, and a state of other files is refused naming
the changed file by its option's path in the run's config)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from cairn.errors import CairnError, ConfigError, IncompatibleConfigError
from cairn.trainers.pytorch.records.documents import Encoder
from cairn.trainers.pytorch.records.fingerprint import (
    cache_dir,
    check_unchanged,
    expand_files,
    file_change,
    file_digests,
    recorded_digests,
)
from cairn.trainers.pytorch.records.lanes import Lane, Source
from cairn.trainers.pytorch.records.options import DataFiles
from cairn.trainers.pytorch.records.readers import list_shards
from cairn.trainers.pytorch.streams import quiet_torchdata

__all__ = ["RecordLoader", "RecordStream"]


class RecordStream(IterableDataset):  # type: ignore[type-arg]
    """Batches of ``batch_size`` sequences, batch ``j`` from lane ``j mod lanes``. In a loader
    worker ``w`` of ``W`` it runs lanes ``w, w + W, ...`` only, which is the same order: the
    loader takes batch ``j`` from worker ``j mod W``."""

    def __init__(self, source: Source, batch_size: int, *, repeat: bool) -> None:
        self.source, self.batch_size, self.repeat = source, batch_size, repeat
        self.lanes = [Lane(source, i, repeat=repeat) for i in range(source.options.lanes)]
        self.turn = 0

    def _mine(self) -> list[Lane]:
        info = get_worker_info()
        return self.lanes if info is None else self.lanes[info.id :: info.num_workers]

    def state_dict(self) -> dict[str, Any]:
        return {"lanes": {str(lane.index): lane.state() for lane in self._mine()}, "turn": self.turn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for lane in self._mine():
            lane.load(state["lanes"][str(lane.index)])
        self.turn = int(state["turn"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mine = self._mine()
        done: set[int] = set()
        while len(done) < len(mine):
            lane = mine[self.turn % len(mine)]
            self.turn = (self.turn + 1) % len(mine)
            if lane.index in done:
                continue
            rows = []
            for _ in range(self.batch_size):
                sequence = lane.next()
                if sequence is None:
                    done.add(lane.index)
                    break
                rows.append(sequence)
            if rows:  # a training lane never ends; an evaluation lane's last batch may be short
                yield torch.from_numpy(np.stack([x for x, _ in rows])), torch.from_numpy(np.stack([y for _, y in rows]))
        for lane in mine:  # an evaluation pass is over: the next one starts from the beginning
            lane.load({})
        self.turn = 0


class RecordLoader:
    """``options``' files as batches of ``(inputs, targets)`` token tensors, through torchdata's
    ``StatefulDataLoader``; ``state_dict()`` is the loader's position and the files' digests.
    ``train``: epochs forever, shuffled, with ``num_workers``; else one pass in file order.
    ``field``: where ``options`` are in the run's config, which every error names
    (``trainer.options.data.files[0] (PATH), line 3: ...``)."""

    def __init__(
        self,
        options: DataFiles,
        tokenizer: Any,
        batch_size: int,
        seed: int,
        *,
        train: bool = True,
        field: str = "trainer.options.data",
    ) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        if not train:
            options = options.model_copy(update={"shuffle": False, "num_workers": 0})
        self.options, self.field = options, field
        self.files = expand_files(options, field)
        self.names = [str(file.path) for file in self.files]
        self.digests = file_digests(self.files, cache_dir(options.hash_cache))
        encoder = Encoder(tokenizer, options, field)
        shards = list_shards([(file.path, file.name) for file in self.files], options)
        if len(shards) < options.lanes:
            raise ConfigError(f"{field}.lanes", expected=f"<= {len(shards)} (the files' shards)", found=options.lanes)
        source = Source(shards, encoder, options, seed + options.seed_offset, field)
        self.dataset = RecordStream(source, batch_size, repeat=train)
        workers = options.num_workers
        with quiet_torchdata():
            self.loader = StatefulDataLoader(
                self.dataset,
                batch_size=None,
                num_workers=workers,
                prefetch_factor=options.prefetch if workers else None,
                generator=torch.Generator().manual_seed(seed + options.seed_offset),  # not the run's RNG
            )
        self._fingerprint = _fingerprint(options, self.names, self.digests, encoder.identity, batch_size, seed)

    def fingerprint(self) -> str:
        """``sha256:HEX`` of the files' names and digests, the options that shape the sequences,
        the tokenizer and the order's seed: what the data is, without reading it."""
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict(), "files": list(self.digests)}

    def check_state(self, state: Any) -> None:
        """A state of these files (``IncompatibleConfigError`` naming a changed file otherwise)."""
        check_unchanged(self.files, self.digests, state, self.field)

    def data_change(self, state: Any) -> IncompatibleConfigError | None:
        """What changed in the files since ``state`` (a checkpoint's, of a run whose data hash is
        not this one's): the refusal naming the first changed file, or the count; None when the
        state records no digests (another loader's) or the same ones (something else changed)."""
        saved = recorded_digests(state)
        return None if saved is None else file_change(self.files, self.digests, saved, self.field)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.loader.load_state_dict(state["loader"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(self.loader)
        while True:
            try:
                yield next(batches)
            except StopIteration:
                return
            except CairnError as exc:
                raise _unwrapped(exc) from None


def _unwrapped(exc: CairnError) -> CairnError:
    """A Cairn error raised in a loader worker arrives as its type around the worker's whole
    traceback: the original one line again."""
    text = str(exc)
    if "DataLoader worker process" not in text:
        return exc
    name = type(exc).__name__
    last = text.rsplit(f"{name}: ", 1)[-1] if f"{name}: " in text else text
    return type(exc)(last.strip())


def _fingerprint(
    options: DataFiles, names: list[str], digests: list[str], tokenizer: str, batch: int, seed: int
) -> str:
    shaping = options.model_dump(exclude={"files", "num_workers", "prefetch", "hash_cache"})
    h = hashlib.sha256(f"records:{sorted(shaping.items())}:{tokenizer}:{batch}:{seed}".encode())
    for name, digest in zip(names, digests, strict=True):
        h.update(f"\0{Path(name).name}\0{digest}".encode())
    return "sha256:" + h.hexdigest()
