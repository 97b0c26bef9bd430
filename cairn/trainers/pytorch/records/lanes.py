"""One lane of a record stream: its share of every epoch's shards read in order, documents packed
into sequences of ``context + 1`` tokens, shuffled in blocks of ``shuffle_buffer`` sequences.

A lane's position is a few integers — where its current block started (epoch, shard, record,
byte offset, token), the block's number and the sequences taken from it — so a resume re-reads
the block from its start and continues with the same sequence, whatever was buffered. A lane
keeps the Parquet row group it reads decoded (``RowGroups``): its blocks do not decode it again."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from cairn.errors import ConfigError
from cairn.trainers.pytorch.records.documents import Encoder
from cairn.trainers.pytorch.records.options import DataFiles
from cairn.trainers.pytorch.records.readers import RowGroups, Shard, read_records
from cairn.trainers.pytorch.scoring import IGNORE_INDEX

__all__ = ["Lane", "Position", "Sequence", "Source"]

Sequence = tuple[np.ndarray, np.ndarray]
"""Inputs (``context`` token ids) and next-token targets (``IGNORE_INDEX`` where not trained on)."""


@dataclass(frozen=True)
class Position:
    """Where a lane reads: ``shard`` indexes the lane's share of epoch ``epoch``'s order; ``token``
    is how much of the document of the record at (``record``, ``offset``) was already packed."""

    epoch: int = 0
    shard: int = 0
    record: int = 0
    offset: int = 0
    token: int = 0


@dataclass(frozen=True)
class Source:
    """What every lane reads: the shards, how records become documents, the order's seed, and
    the options' path in the run's config (``trainer.options.data``: what errors name)."""

    shards: list[Shard]
    encoder: Encoder
    options: DataFiles
    seed: int
    field: str

    def share(self, epoch: int, lane: int) -> list[Shard]:
        """Lane ``lane``'s shards in epoch ``epoch``: every ``lanes``-th of a seeded permutation."""
        n = len(self.shards)
        order = np.random.default_rng([self.seed, 0, epoch]).permutation(n) if self.options.shuffle else range(n)
        return [self.shards[int(i)] for i in list(order)[lane :: self.options.lanes]]


class Lane:
    """Lane ``index`` of ``source``; ``repeat``: epochs follow each other forever (training),
    else one epoch in file order and its last partial sequence dropped (evaluation)."""

    def __init__(self, source: Source, index: int, *, repeat: bool) -> None:
        self.source, self.index, self.repeat = source, index, repeat
        self.block_size = source.options.shuffle_buffer if source.options.shuffle else 1
        self.groups = RowGroups()
        self.load({})

    # -- position ------------------------------------------------------------------------------
    def state(self) -> dict[str, int]:
        return {**asdict(self.start), "block": self.block, "taken": self.taken}

    def load(self, state: dict[str, int]) -> None:
        self.start = Position(**{k: int(state[k]) for k in asdict(Position()) if k in state})
        self.block, self.taken = int(state.get("block", 0)), int(state.get("taken", 0))
        self._buffer: list[tuple[Sequence, Position]] | None = None
        self._order: list[int] = []

    # -- sequences -----------------------------------------------------------------------------
    def next(self) -> Sequence | None:
        """The lane's next sequence (None: an evaluation lane's epoch is over)."""
        if self._buffer is None:
            self._fill()
        assert self._buffer is not None
        if self.taken == len(self._buffer):
            if len(self._buffer) < self.block_size:
                return None
            self.start, self.block, self.taken = self._buffer[-1][1], self.block + 1, 0
            self._fill()
            if not self._buffer:
                return None
        sequence = self._buffer[self._order[self.taken]][0]
        self.taken += 1
        return sequence

    def _fill(self) -> None:
        """The current block: up to ``block_size`` sequences from ``start``, each with the
        position after it, and the block's seeded order."""
        buffer: list[tuple[Sequence, Position]] = []
        for item in self._sequences(self.start):
            buffer.append(item)
            if len(buffer) == self.block_size:
                break
        self._buffer = buffer
        n = len(buffer)
        rng = np.random.default_rng([self.source.seed, 1, self.index, self.block])
        self._order = [int(i) for i in rng.permutation(n)] if self.source.options.shuffle else list(range(n))
        if self.taken > n:
            raise ConfigError("data stream state", expected=f"<= {n} sequences taken from the block", found=self.taken)

    def _sequences(self, start: Position) -> Iterator[tuple[Sequence, Position]]:
        need = self.source.options.context + 1
        ids: list[int] = []
        flags: list[bool] = []
        for (doc, trained), here, after in self._documents(start):
            at = start.token if here == replace(start, token=0) else 0
            while at < len(doc):
                take = min(need - len(ids), len(doc) - at)
                ids += doc[at : at + take]
                flags += trained[at : at + take]
                at += take
                if len(ids) == need:
                    window = np.asarray(ids, dtype=np.int64)
                    target = np.where(np.asarray(flags[1:]), window[1:], IGNORE_INDEX)
                    yield (window[:-1], target), (after if at == len(doc) else replace(here, token=at))
                    ids, flags = [], []

    def _documents(self, start: Position) -> Iterator[tuple[tuple[list[int], list[bool]], Position, Position]]:
        """Documents from ``start`` on, each with its record's position and the next record's,
        across shards and (``repeat``) epochs."""
        epoch, shard, record, offset = start.epoch, start.shard, start.record, start.offset
        while True:
            share = self.source.share(epoch, self.index)  # never empty: lanes <= shards
            found = False
            while shard < len(share):
                s = share[shard]
                for r in read_records(s, record, offset, self.source.options, self.groups):
                    where = f"{s.where}, " + (
                        f"row group {s.group} row {r.index}" if s.format == "parquet" else f"line {r.index + 1}"
                    )
                    here = Position(epoch, shard, r.index, r.offset)
                    after = Position(epoch, shard, r.next_index, r.next_offset)
                    found = True
                    yield self.source.encoder.document(r.value, where), here, after
                shard, record, offset = shard + 1, 0, 0
                # the position after a shard's last record is the next shard's start
            if not self.repeat:
                return
            if not found and start.epoch < epoch:
                raise ConfigError(
                    f"{self.source.field}.files",
                    expected="records",
                    found=f"none in epoch {epoch} of lane {self.index}",
                )
            epoch, shard = epoch + 1, 0
