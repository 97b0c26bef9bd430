"""How checkpoints are written and read: one typed options object instead of loose keywords.

``CheckpointOptions`` carries the signer policy, the read bounds and the shard settings. Every
write and every manifest read takes one, so the same policy applies on every path: when a
signing key is configured, every commit is signed and every manifest read verifies the
signature — ``read_manifest``, ``load_training``, ``verify`` and the async saver alike.
The edges build one: ``CheckpointOptions.from_env()`` reads the key from the environment
(``CAIRN_SIGNING_KEY`` / ``CAIRN_SIGNING_KEY_FILE``) once per command, activity, session or rank,
and the object is passed down; the helpers below an edge take it, never None. An entry point a
user calls (``save_training``, ``load_training``, ``TrainingSession``'s constructors,
``latest_committed``) may be given none and gets the configured ones (``resolve_options``, the
one place that default is stated).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from cairn.checkpoint.signing import Signer, signer_from_env
from cairn.errors import ConfigError

__all__ = [
    "Limits",
    "DEFAULT_LIMITS",
    "CEILING_ENV",
    "INCREMENTAL_ENV",
    "COMPRESSION_ENV",
    "COMPRESSION_MODES",
    "parse_byte_count",
    "CheckpointOptions",
    "checkpoint_overrides",
    "resolve_options",
]


CEILING_ENV = "CAIRN_MAX_CHECKPOINT_BYTES"
"""Overrides the ceiling on a checkpoint's total bytes (``Limits.max_total_bytes``)."""
INCREMENTAL_ENV = "CAIRN_INCREMENTAL"
"""``1``/``true``/``on`` turns on incremental training checkpoints (``CheckpointOptions.incremental``)."""
COMPRESSION_ENV = "CAIRN_COMPRESSION"
COMPRESSION_MODES = ("off", "zstd", "auto")
"""``checkpoint.compression``: never, always, or where it makes saves faster (``cairn.checkpoint.compression``)."""


@dataclass(frozen=True)
class Limits:
    """Ceilings checked from the manifest alone, before anything is allocated; a writer refuses
    content past them too, so whatever commits can be read back.

    These are only the outer bound, for a reader that knows nothing of the run. A training
    import is sized by the run itself: its trainer's tensor specs give every tensor's exact
    dtype and shape, and a checkpoint that claims more than they add up to is refused before
    any byte is read (``cairn.checkpoint.validate``). The ceilings are set high enough for a
    trillion-parameter state trained with Adam (16 TB) and low enough that a forged claim of
    10^15 bytes is refused by the ceiling alone.
    """

    max_manifest_bytes: int = 16 << 20
    """The manifest (for format v3, the root manifest)."""
    max_tensors: int = 1 << 16
    """Logical tensors (a v1 manifest's entries, a blocked manifest's ``parts``)."""
    max_total_bytes: int = 64 << 40
    max_ndim: int = 8
    max_blocks: int = 1 << 24
    """Block entries of a blocked checkpoint, over all its ranks."""
    max_index_bytes: int = 256 << 20
    """One rank's index object (format v3)."""
    sized_by: str = "the ceiling"
    """Where these bounds come from, for the refusal's message ("the run's trainer", ...)."""

    @classmethod
    def from_env(cls) -> Limits:
        """The default ceilings, with ``CAIRN_MAX_CHECKPOINT_BYTES`` (an integer byte count,
        optionally with a KiB/MiB/GiB/TiB suffix) as the total-bytes ceiling when set."""
        raw = os.environ.get(CEILING_ENV, "").strip()
        return cls() if not raw else cls(max_total_bytes=parse_byte_count(raw, CEILING_ENV))


_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "PIB": 1 << 50}


def parse_byte_count(text: str, field: str) -> int:
    """``'64TiB'``, ``'1048576'`` -> bytes; ``ConfigError`` naming ``field`` otherwise."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or int(match.group(1)) <= 0:
        raise ConfigError(field=field, expected="a positive byte count, e.g. 68719476736 or 64TiB", found=text)
    return int(match.group(1)) * _UNITS[unit]


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class CheckpointOptions:
    signer: Signer | None = None
    """Signs every commit and verifies every manifest read; None: no signing."""
    limits: Limits = field(default_factory=Limits)
    shard_bytes: int = 64 << 20
    """Target size of one shard file (tensors are never split across shards)."""
    max_workers: int = 4
    """Shards written, or tensors read, concurrently."""
    incremental: bool = False
    """Training saves reference the blocks the run already holds durably instead of rewriting
    them (``cairn.checkpoint.reuse``); a single-process save then writes the blocked layout
    (format v3), at the run's ``distributed.block_bytes`` or else ``block_bytes``."""
    block_bytes: int = 1 << 20
    """The block size of an incremental single-process run without a ``distributed`` section."""
    compression: str = "off"
    """Saves store their bytes raw (``off``), compressed (``zstd``: ``cairn.checkpoint.codec``),
    or compressed where that makes them faster (``auto``: ``cairn.checkpoint.compression``).
    Restores read any of them, whatever this says."""

    def __post_init__(self) -> None:
        if self.block_bytes < 64 or self.block_bytes % 8:
            raise ConfigError("checkpoint block_bytes", expected="a multiple of 8, >= 64", found=self.block_bytes)
        if self.compression not in COMPRESSION_MODES:
            raise ConfigError(
                field="checkpoint.compression", expected=" | ".join(COMPRESSION_MODES), found=self.compression
            )

    @classmethod
    def from_env(cls, **overrides: object) -> CheckpointOptions:
        """The configured signer (``CAIRN_SIGNING_KEY[_FILE]``), ceilings (``Limits.from_env``),
        incremental saves (``CAIRN_INCREMENTAL``) and compression (``CAIRN_COMPRESSION``)."""
        overrides.setdefault("limits", Limits.from_env())
        overrides.setdefault("incremental", _flag(INCREMENTAL_ENV))
        overrides.setdefault("compression", _mode(COMPRESSION_ENV))
        return cls(signer=signer_from_env(), **overrides)  # type: ignore[arg-type]


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false", "off", "no"):
        return False
    if raw in ("1", "true", "on", "yes"):
        return True
    raise ConfigError(field=name, expected="1, true, on (or 0, false, off)", found=raw)


def _mode(name: str) -> str:
    raw = os.environ.get(name, "").strip().lower() or "off"
    if raw not in COMPRESSION_MODES:
        raise ConfigError(field=name, expected=" | ".join(COMPRESSION_MODES), found=raw)
    return raw


def checkpoint_overrides(incremental: bool | None, compression: str | None) -> dict[str, object]:
    """``CheckpointOptions.from_env`` keywords for a run's ``checkpoint.incremental`` and
    ``checkpoint.compression`` (None: the environment's setting stands)."""
    given = {"incremental": incremental, "compression": compression}
    return {name: value for name, value in given.items() if value is not None}


def resolve_options(options: CheckpointOptions | None) -> CheckpointOptions:
    """``options``, or the configured ones (``from_env``) when a caller passed none."""
    return options if options is not None else CheckpointOptions.from_env()
