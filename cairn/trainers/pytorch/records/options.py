"""``DataFiles``: the options of a dataset read from local files as a resumable stream (a config
section a trainer's options embed): which files, how their records are read and tokenised, how
they are packed, shuffled and loaded."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DataFile", "DataFiles"]

SHA256 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


class DataFile(BaseModel):
    """One file whose content hash the user declares (it is then not read to be fingerprinted)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str = Field(min_length=1)
    """A file (not a glob)."""
    sha256: str
    """Its SHA-256, hex (``sha256:`` prefix optional)."""

    @model_validator(mode="after")
    def _hex(self) -> DataFile:
        if not SHA256.match(self.sha256):
            raise ValueError(f"sha256 must be 64 hex digits (found {self.sha256!r})")
        return self


class DataFiles(BaseModel):
    """Local JSONL, Parquet or text files read as a stream whose position rides in the
    checkpoint's data cursor (``records_loader``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    files: list[str | DataFile] = Field(min_length=1, max_length=100_000)
    """Files or globs (sorted, expanded at build), or ``{path, sha256}`` entries the user vouches for."""
    format: Literal["auto", "jsonl", "parquet", "text"] = "auto"
    """``auto``: by suffix (``.jsonl``/``.json`` JSON lines, ``.parquet``, anything else text)."""
    records: Literal["text", "chat", "instruction"] = "text"
    """What a record is: text (``text_field``; a text file's paragraphs), a chat
    (``messages_field``: ``[{role, content}, ...]``) or an instruction (``prompt_field``,
    ``response_field``). Chat and instruction records train on the assistant's tokens only."""
    text_field: str = "text"
    messages_field: str = "messages"
    prompt_field: str = "prompt"
    response_field: str = "response"
    template: Literal["auto", "simple", "chat_template"] = "auto"
    """How chat and instruction records become text: the tokenizer's ``chat_template``
    (``auto`` when it has one) or Cairn's simple one (``<|role|>\\ncontent\\n`` per message)."""
    eos_token: str = "<|endoftext|>"
    """The token between documents when the tokenizer names none (a ``tokenizers.Tokenizer``)."""
    context: int = Field(default=512, ge=2, le=1 << 20)
    """Tokens per training sequence (inputs and next-token targets)."""
    lanes: int = Field(default=1, ge=1, le=256)
    """Independent readers the sample order is defined over: lane ``l`` reads its share of each
    epoch's shards and packs its own sequences; batch ``j`` comes from lane ``j mod lanes``."""
    num_workers: int = Field(default=0, ge=0, le=256)
    """Loader worker processes (each runs ``lanes / num_workers`` lanes): same batches, same bits as 0."""
    prefetch: int = Field(default=2, ge=1, le=64)
    """Batches each worker prepares ahead (``prefetch_factor``; with workers only)."""
    shuffle: bool = True
    """Shuffle the shards' order every epoch and sequences within ``shuffle_buffer``."""
    shuffle_buffer: int = Field(default=256, ge=1, le=1 << 20)
    """Sequences shuffled together (a block re-read from its start position on resume)."""
    seed_offset: int = Field(default=0, ge=0)
    """Added to the run's seed for the data order."""
    max_record_bytes: int = Field(default=16 << 20, ge=64, le=1 << 31)
    """A JSONL line or text paragraph longer than this is refused without being read whole."""
    max_row_group_bytes: int = Field(default=512 << 20, ge=1024, le=1 << 40)
    """A Parquet row group larger than this (uncompressed) is refused before it is read."""
    hash_cache: str | None = None
    """Where content hashes are cached by (path, size, mtime); default ``$XDG_CACHE_HOME/cairn/data-hashes``."""

    @model_validator(mode="after")
    def _workers_divide_lanes(self) -> DataFiles:
        if self.num_workers and self.lanes % self.num_workers:
            raise ValueError(
                f"num_workers must divide lanes (the order is defined over lanes; "
                f"found lanes={self.lanes}, num_workers={self.num_workers})"
            )
        return self
