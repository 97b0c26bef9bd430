"""Cairn's one exception tree.

Every error a user can meet is one of these; the message names the field and the
expected vs found value, so a refused import says exactly why::

    CairnError                                                     retryable  exit
     ├── ConfigError                  a trainer/run config, input or path is malformed   no    2
     │    ├── ReferenceSyntaxError      a checkpoint reference is not STORE/RUN/KIND/STEP   no    2
     │    ├── StoreIdentityError        this store is not the one the run was started on     no    2
     │    ├── StoreNotFoundError        no such bucket / the store cannot be created or read no    2
     │    ├── RunOwnershipError         another workflow already trains this run id         no    2
     │    └── NumericsProfileError      this process cannot compute under the numerics profile no  2
     ├── StorageError                 the store could not be read or written               yes   3
     │    └── ObjectNotFoundError     a key the caller named does not exist                yes   3
     ├── InvalidObjectError           an object in the store is malformed (not a regular   no    1
     │                                file, a symlink out of the store, a bad key): same bytes, same verdict
     ├── TrainingDivergedError        training produced NaN/inf: nothing is committed       no    1
     ├── TrainerCodeError             the trainer's own code (build, forward, data) raised  no    1
     ├── GangFailedError              a rank of a distributed segment died; gang stopped  yes   3
     ├── WorkerCrashLoopError         the supervised worker process crashed too often      no    1
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
     │    ├── ProfileMismatchError      a bit-exact resume under another numerics profile than the state's
     │    └── CheckpointConflictError   same idempotency key, different content (non-determinism)
     ├── EffectError                  an external side effect was refused                 no    4
     │    ├── EffectUnavailableError    the service could not be reached (outcome unknown)  yes   4
     │    └── IdempotencyConflictError  same idempotency key, different request body        no    4
     ├── TemporalUnavailableError     the Temporal frontend cannot be reached              yes   5
     │    └── TemporalRefusedError      it answered no: unknown workflow id, id already running no 5
     └── CommandInterrupted           Ctrl-C                                               no  130

Policy is declared on the classes (``retryable``, ``exit_code``), never probed: the activity
edge reads ``retryable`` to build a Temporal ``ApplicationError``; the CLI reads ``exit_code``.
Checkpoint errors describe bytes that will not change on a second read, so they never retry.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CairnError",
    "ConfigError",
    "MissingExtraError",
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
    "TrainerCodeError",
    "IncompatibleConfigError",
    "SignatureError",
    "CheckpointConflictError",
    "EffectError",
    "EffectUnavailableError",
    "IdempotencyConflictError",
    "InvalidObjectError",
    "ReferenceSyntaxError",
    "RunOwnershipError",
    "NumericsProfileError",
    "ProfileMismatchError",
    "StoreIdentityError",
    "StoreNotFoundError",
    "TemporalRefusedError",
    "CommandInterrupted",
    "TemporalUnavailableError",
    "TrainingDivergedError",
    "GangFailedError",
    "WorkerCrashLoopError",
    "error_named",
    "one_line",
]


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return one_line(text, limit)


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters: what a user or a UI headline sees."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class CairnError(Exception):
    """Root of every error Cairn raises on purpose.

    ``field``, ``expected`` and ``found`` are kept as attributes so scripts (and the
    activity edge, which turns them into Temporal application errors) need not parse text.
    ``ConfigError("steps", expected=..., found=...)`` (no ``field=``) names the field ``steps``.
    """

    retryable: ClassVar[bool] = False
    """Whether trying the same operation again may succeed (Temporal retries only these)."""
    exit_code: ClassVar[int] = 2
    """The ``cairn`` command's exit status for this error (see the README's table)."""

    def __init__(
        self,
        message: str | None = None,
        *,
        field: str | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        if field is None and message is not None and (expected is not None or found is not None):
            field, message = message, None  # ConfigError("steps", expected=..., found=...)
        self.field = field
        self.expected = expected
        self.found = found
        if message is None:
            message = f"{field}: expected {_short(expected)}, found {_short(found)}"
        elif field is not None and expected is not None:
            message = f"{field}: {message} (expected {_short(expected)}, found {_short(found)})"
        elif field is not None:
            message = f"{field}: {message}"
        super().__init__(one_line(message, 2000))

    @property
    def type_name(self) -> str:
        return type(self).__name__


class ConfigError(CairnError):
    """A configuration file or value is malformed or unusable."""


class MissingExtraError(ConfigError):
    """What a command needs is in an optional part of Cairn that is not installed here (the dev
    servers: ``cairn-train[stack]``; plots: ``cairn-train[report]``); the message names the extra."""

    def __init__(self, what: str, extra: str, needed_by: str) -> None:
        super().__init__(
            f"{needed_by} needs {what}, which is not installed in this Python environment: "
            f"pip install 'cairn-train[{extra}]'"
        )
        self.extra = extra


class ReferenceSyntaxError(ConfigError):
    """A checkpoint reference is not of the form ``STORE/RUN_ID/KIND/STEP``."""


class StoreIdentityError(ConfigError):
    """The store opened here is not the store the run was started on (e.g. a relative or
    local path that resolves to another directory on another host)."""


class StoreNotFoundError(ConfigError):
    """The store does not exist or cannot be used at all (no such bucket, access denied, a
    directory that cannot be created): a retry would meet the same answer."""


class RunOwnershipError(ConfigError):
    """Another workflow already trains this run id in this store: two writers would interleave."""


class NumericsProfileError(ConfigError):
    """This process does not compute under the numerics profile asked for (another CPU level, a
    control set after numpy was imported, an unknown profile name)."""


class StorageError(CairnError):
    """The store failed to read or write. Transient by nature: callers may retry."""

    retryable = True
    exit_code = 3


class ObjectNotFoundError(StorageError):
    """The named object does not exist in the store."""


class InvalidObjectError(CairnError):
    """An object in the store is malformed: not a regular file, a symlink leaving the store,
    a key with '..', NUL or newline. Content, not transport: a retry reads the same thing."""

    exit_code = 1


class TrainingDivergedError(CairnError):
    """Training produced a non-finite value (loss, parameter or moment); nothing was committed."""

    exit_code = 1


class TrainerCodeError(CairnError):
    """The user's trainer code raised (``build()``, a forward/backward pass, a dataset item).
    Deterministic code given the same state: a retry would raise again, so it fails the run."""

    exit_code = 1
    trained: Any = None
    """The last whole state trained before the failure, when the trainer kept one (an
    evaluation raised after its update): the session commits it before the error surfaces."""


class WorkerCrashLoopError(CairnError):
    """The worker process under ``cairn worker``'s supervisor crashed too often within its
    restart window: the supervisor gives up (exit 1) and leaves the restart to its own service
    manager (systemd, Kubernetes)."""

    exit_code = 1


class GangFailedError(CairnError):
    """A rank of a distributed segment died or failed, so the whole gang was stopped (every rank
    process reaped). Nothing half-saved is committed: a retry resumes from the last commit."""

    retryable = True
    exit_code = 3


def error_named(type_name: str, message: str) -> CairnError:
    """Rebuild a typed error another process reported (by class name and message); an unknown
    name becomes a ``GangFailedError`` carrying the message."""
    todo: list[type[CairnError]] = [CairnError]
    while todo:
        cls = todo.pop()
        if cls.__name__ == type_name:
            err = cls.__new__(cls)
            Exception.__init__(err, one_line(message, 2000))
            err.field = err.expected = err.found = None
            return err
        todo.extend(cls.__subclasses__())
    return GangFailedError(f"{type_name}: {message}")


class CheckpointError(CairnError):
    """A checkpoint was refused. Deterministic: re-reading the same bytes gives the same verdict."""

    exit_code = 1


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


class ProfileMismatchError(CheckpointError):
    """A bit-exact run's checkpoint was computed under another numerics profile than this
    process's: resuming it would give bits no uninterrupted run produces."""


class CheckpointConflictError(CheckpointError):
    """A committed checkpoint with the same idempotency key has a different fingerprint."""


class EffectError(CairnError):
    """An external side effect was refused, or its outcome could not be established."""

    exit_code = 4


class EffectUnavailableError(EffectError):
    """The service could not be reached or failed (5xx): the outcome is unknown; retry with the same key."""

    retryable = True


class IdempotencyConflictError(EffectError):
    """The service already holds this idempotency key for a different request body."""


class TemporalUnavailableError(CairnError):
    """The Temporal frontend could not be reached."""

    retryable = True
    exit_code = 5


class TemporalRefusedError(TemporalUnavailableError):
    """Temporal answered, and the answer is no: an unknown workflow id, an id already running."""

    retryable = False


class CommandInterrupted(CairnError):
    """The user interrupted a command (Ctrl-C)."""

    exit_code = 130
