"""Records read from local files without loading a file whole: JSON lines and text paragraphs
from a byte offset, Parquet one bounded row group at a time (``RowGroups``: the one a lane reads
now, decoded once for all its blocks). A file's shards (a JSONL or text file is one; a Parquet
file has one per row group) are the units an epoch's order permutes. Malformed input is refused
with one ``ConfigError`` line naming the file (its entry in the run's config and its path) and
the line or row group."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError, MissingExtraError
from cairn.trainers.pytorch.records.options import DataFiles

__all__ = ["Record", "RowGroups", "Shard", "file_format", "list_shards", "read_records"]

_ROWS = 256
"""Parquet rows turned into Python values at a time (a block rarely needs a whole row group)."""


@dataclass(frozen=True)
class Shard:
    """A unit of an epoch's order: a whole JSONL/text file, or one row group of a Parquet file;
    ``name`` is how errors name its file (``trainer.options.data.files[K] (PATH)``)."""

    path: Path
    format: str
    group: int = 0
    name: str = ""

    @property
    def where(self) -> str:
        return self.name or f"data file {self.path}"


@dataclass(frozen=True)
class Record:
    """One record and where it is: its index in the shard (a line, a paragraph's first line, a
    row), its byte offset (0 for Parquet), and the index and offset of the record after it."""

    value: Any
    index: int
    offset: int
    next_index: int
    next_offset: int


def file_format(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}.get(suffix, "text")


def _parquet(path: Path, where: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise MissingExtraError("pyarrow", "hf", f"reading the Parquet file {path}") from None

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # a truncated or foreign file: pyarrow's ArrowInvalid, OSError
        raise ConfigError(where, expected="a Parquet file", found=_short(exc)) from None


def list_shards(files: Sequence[tuple[Path, str]], options: DataFiles) -> list[Shard]:
    """Every file's shards, in the files' order (a Parquet file's footer is read, nothing else);
    ``files``: each file's path and how errors name it."""
    shards: list[Shard] = []
    for path, name in files:
        fmt = file_format(path, options.format)
        if fmt != "parquet":
            shards.append(Shard(path, fmt, name=name))
            continue
        groups = _parquet(path, name).metadata.num_row_groups
        shards.extend(Shard(path, fmt, g, name) for g in range(groups))
    return shards


class RowGroups:
    """The Parquet row group a lane reads now, decoded (its needed columns only), so that every
    block read from it after the first reads memory, not the file. One at a time: the next
    row group replaces it (a lane holds at most ``max_row_group_bytes`` of decoded rows). Not
    carried into a loader worker (a pickled lane starts empty)."""

    def __init__(self) -> None:
        self.shard: Shard | None = None
        self.table: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"shard": None, "table": None}

    def read(self, shard: Shard, options: DataFiles) -> Any:
        """The row group's table (``pyarrow.Table``), decoded unless it is the one held."""
        if self.shard != shard:
            self.shard, self.table = None, None  # the old one is released before the new one is read
            self.table = _row_group(shard, options)
            self.shard = shard
        return self.table


def read_records(
    shard: Shard, index: int, offset: int, options: DataFiles, groups: RowGroups | None = None
) -> Iterator[Record]:
    """The shard's records from record ``index`` (at byte ``offset`` for JSONL and text); a
    Parquet row group through ``groups`` (the lane's: decoded once), else read here."""
    if shard.format == "parquet":
        table = groups.read(shard, options) if groups is not None else _row_group(shard, options)
        for start in range(index, table.num_rows, _ROWS):
            for i, value in enumerate(table.slice(start, _ROWS).to_pylist(), start=start):
                yield Record(value, i, 0, i + 1, 0)
    elif shard.format == "jsonl":
        for line, (raw, at, after) in _lines(shard, index, offset, options.max_record_bytes):
            if raw.strip():
                yield Record(_json(raw, shard, line), line, at, line + 1, after)
    else:
        yield from _paragraphs(shard, index, offset, options.max_record_bytes)


def _lines(shard: Shard, line: int, offset: int, limit: int) -> Iterator[tuple[int, tuple[bytes, int, int]]]:
    """``(line number, (bytes, offset, next offset))`` from ``offset``; a line over ``limit``
    bytes is refused after reading ``limit + 1`` of them."""
    try:
        with shard.path.open("rb") as f:
            f.seek(offset)
            while True:
                raw = f.readline(limit + 2)
                if not raw:
                    return
                if len(raw.rstrip(b"\r\n")) > limit:
                    raise ConfigError(
                        f"{shard.where}, line {line + 1}",
                        expected=f"<= {limit} bytes (max_record_bytes)",
                        found="a longer line",
                    )
                yield line, (raw, offset, offset + len(raw))
                line, offset = line + 1, offset + len(raw)
    except OSError as exc:
        raise ConfigError(shard.where, expected="a readable file", found=_short(exc)) from None


def _json(raw: bytes, shard: Shard, line: int) -> Any:
    where = f"{shard.where}, line {line + 1}"
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(where, expected="a JSON object", found=_short(exc)) from None
    if not isinstance(value, dict):
        raise ConfigError(where, expected="a JSON object", found=type(value).__name__)
    return value


def _paragraphs(shard: Shard, index: int, offset: int, limit: int) -> Iterator[Record]:
    """Runs of non-blank lines; a paragraph over ``limit`` bytes is refused."""
    parts: list[bytes] = []
    first, start, size = index, offset, 0
    for line, (raw, at, after) in _lines(shard, index, offset, limit):
        if raw.strip():
            if not parts:
                first, start = line, at
            parts.append(raw)
            size += len(raw)
            if size > limit:
                raise ConfigError(
                    f"{shard.where}, line {first + 1}",
                    expected=f"a paragraph of <= {limit} bytes (max_record_bytes)",
                    found=size,
                )
            continue
        if parts:
            yield Record(_text(parts, shard, first), first, start, line + 1, after)
            parts, size = [], 0
    if parts:
        yield Record(_text(parts, shard, first), first, start, first + len(parts), start + size)


def _text(parts: list[bytes], shard: Shard, line: int) -> str:
    try:
        return b"".join(parts).decode("utf-8").strip("\r\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shard.where}, line {line + 1}", expected="UTF-8 text", found=_short(exc)) from None


def _row_group(shard: Shard, options: DataFiles) -> Any:
    """The row group's needed columns, decoded: refused before it is read when it is over
    ``max_row_group_bytes`` (uncompressed) or lacks a column."""
    where = f"{shard.where}, row group {shard.group}"
    pf = _parquet(shard.path, shard.where)
    size = pf.metadata.row_group(shard.group).total_byte_size
    if size > options.max_row_group_bytes:
        raise ConfigError(where, expected=f"<= {options.max_row_group_bytes} bytes (max_row_group_bytes)", found=size)
    columns = _columns(options)
    missing = sorted(set(columns) - set(pf.schema_arrow.names))
    if missing:
        raise ConfigError(where, expected=f"columns {columns}", found=f"no column {missing[0]!r}")
    try:
        return pf.read_row_group(shard.group, columns=columns)
    except Exception as exc:  # corrupt pages: pyarrow's ArrowInvalid, OSError
        raise ConfigError(where, expected="a readable row group", found=_short(exc)) from None


def _columns(options: DataFiles) -> list[str]:
    if options.records == "chat":
        return [options.messages_field]
    if options.records == "instruction":
        return [options.prompt_field, options.response_field]
    return [options.text_field]


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
