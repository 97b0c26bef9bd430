"""Cairn's one exception tree.

Every error a user can meet is one of these; the message names the field and the
expected vs found value, so a refused import says exactly why::

    CairnError
     ├── ConfigError                  a trainer/run config is malformed or unusable
     ├── StorageError                 the store could not be read or written (retryable)
     │    └── ObjectNotFoundError     a key the caller named does not exist
     ├── CheckpointError              a checkpoint is refused (never retryable: same bytes, same verdict)
     │    ├── CheckpointNotFoundError   no committed manifest at that reference
     │    ├── ManifestError             manifest is not valid JSON / does not match the schema
     │    ├── FormatVersionError        format name or version not supported
     │    ├── KindMismatchError         e.g. a journal offered where a training state is expected
     │    ├── SizeLimitError            manifest bytes, tensor count or total bytes over the bound
     │    ├── TensorSpecError           tensor set, dtype, shape or byte length wrong
     │    ├── IntegrityError            checksum or fingerprint mismatch (corruption)
     │    ├── NonFiniteError            NaN or Inf in a tensor
     │    ├── InvariantError            cross-field invariant broken (cursor, history, v >= 0, RNG)
     │    ├── IncompatibleConfigError   checkpoint belongs to a different model/dataset/version
     │    ├── SignatureError            signing key configured and the signature is missing/invalid
     │    └── CheckpointConflictError   same idempotency key, different content (non-determinism)
     └── EffectError                  an external side effect was refused or could not be confirmed
          └── IdempotencyConflictError  same idempotency key, different request body

``StorageError`` is the only family worth retrying: checkpoint errors describe bytes that
will not change on a second read.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CairnError",
    "ConfigError",
    "StorageError",
    "ObjectNotFoundError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ManifestError",
    "FormatVersionError",
    "KindMismatchError",
    "SizeLimitError",
    "TensorSpecError",
    "IntegrityError",
    "NonFiniteError",
    "InvariantError",
    "IncompatibleConfigError",
    "SignatureError",
    "CheckpointConflictError",
    "EffectError",
    "IdempotencyConflictError",
]


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CairnError(Exception):
    """Root of every error Cairn raises on purpose.

    ``field``, ``expected`` and ``found`` are kept as attributes so scripts (and the
    activity edge, which turns them into Temporal application errors) need not parse text.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        field: str | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        self.field = field
        self.expected = expected
        self.found = found
        if message is None:
            message = f"{field}: expected {_short(expected)}, found {_short(found)}"
        elif field is not None and expected is not None:
            message = f"{field}: {message} (expected {_short(expected)}, found {_short(found)})"
        elif field is not None:
            message = f"{field}: {message}"
        super().__init__(message)

    @property
    def type_name(self) -> str:
        return type(self).__name__


class ConfigError(CairnError):
    """A configuration file or value is malformed or unusable."""


class StorageError(CairnError):
    """The store failed to read or write. Transient by nature: callers may retry."""


class ObjectNotFoundError(StorageError):
    """The named object does not exist in the store."""


class CheckpointError(CairnError):
    """A checkpoint was refused. Deterministic: re-reading the same bytes gives the same verdict."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint at the reference (a half-written one does not count)."""


class ManifestError(CheckpointError):
    """The manifest is not JSON, or does not match the manifest schema."""


class FormatVersionError(CheckpointError):
    """The checkpoint format or its version is not one this build reads."""


class KindMismatchError(CheckpointError):
    """The checkpoint is of another kind than the slot it is offered to."""


class SizeLimitError(CheckpointError):
    """A declared size exceeds a bound; refused before anything is allocated."""


class TensorSpecError(CheckpointError):
    """A tensor is missing, unexpected, or has the wrong dtype, shape or byte length."""


class IntegrityError(CheckpointError):
    """Bytes do not match their checksum, or the manifest does not match its fingerprint."""


class NonFiniteError(CheckpointError):
    """A tensor holds NaN or infinity."""


class InvariantError(CheckpointError):
    """A cross-field invariant of the training state does not hold."""


class IncompatibleConfigError(CheckpointError):
    """The checkpoint was made for another model, dataset or version than this run's."""


class SignatureError(CheckpointError):
    """A signing key is configured and the manifest's signature is missing or wrong."""


class CheckpointConflictError(CheckpointError):
    """A committed checkpoint with the same idempotency key has a different fingerprint."""


class EffectError(CairnError):
    """An external side effect was refused, or its outcome could not be established."""


class IdempotencyConflictError(EffectError):
    """The service already holds this idempotency key for a different request body."""
