"""A numbered log: JSON objects ``PREFIX/SEQ.json`` (12 digits, so keys sort by number), each
appended by create-if-absent, so of two writers racing for one number exactly one wins (the
other re-reads and decides again). Run ownership claims and the lifecycle log are numbered
logs; their prefixes are in ``cairn.checkpoint.layout``."""

from __future__ import annotations

from dataclasses import dataclass

from cairn.stores.base import Store

__all__ = ["SEQ_DIGITS", "NumberedLog", "numbered_key", "sequence_number"]

SEQ_DIGITS = 12


def numbered_key(prefix: str, seq: int) -> str:
    """The ``seq``-th entry under ``prefix`` (which ends with ``/``)."""
    return f"{prefix}{seq:0{SEQ_DIGITS}d}.json"


def sequence_number(key: str) -> int | None:
    """The number of a numbered log entry (``.../SEQ.json``), or None for any other key."""
    name = key.rsplit("/", 1)[-1]
    stem = name[:-5]
    return int(stem) if name.endswith(".json") and stem.isascii() and stem.isdigit() else None


@dataclass(frozen=True)
class NumberedLog:
    """The numbered log under ``prefix`` in ``store``; the first entry is number ``first``."""

    store: Store
    prefix: str
    first: int = 0

    def entries(self) -> list[tuple[int, str]]:
        """(number, key) of every entry, in order (other keys under the prefix are ignored)."""
        numbered = ((sequence_number(info.key), info.key) for info in self.store.list(self.prefix))
        return sorted((seq, key) for seq, key in numbered if seq is not None)

    def try_append(self, entries: list[tuple[int, str]], body: bytes) -> int | None:
        """Create the entry after the last of ``entries`` (what the caller read and decided on);
        its number, or None when another writer created it first (re-read and decide again)."""
        seq = entries[-1][0] + 1 if entries else self.first
        return seq if self.store.put_if_absent(numbered_key(self.prefix, seq), body) else None
