"""How checkpoints are written and read: one typed options object instead of loose keywords.

``CheckpointOptions`` carries the signer policy, the read bounds and the shard settings. Every
write and every manifest read takes one, so the same policy applies on every path: when a
signing key is configured, every commit is signed and every manifest read verifies the
signature — ``read_manifest``, ``load_training``, ``verify`` and the async saver alike.
The edges build one: ``CheckpointOptions.from_env()`` reads the key from the environment
(``CAIRN_SIGNING_KEY`` / ``CAIRN_SIGNING_KEY_FILE``) once per command, activity, session or rank,
and the object is passed down. A library call given no options gets the configured ones
(``resolve_options``, the one place that default is stated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cairn.checkpoint.signing import Signer, signer_from_env

__all__ = ["Limits", "DEFAULT_LIMITS", "CheckpointOptions", "resolve_options"]


@dataclass(frozen=True)
class Limits:
    """Bounds checked from the manifest alone, before anything is allocated; a writer refuses
    content past them too, so whatever commits can be read back."""

    max_manifest_bytes: int = 16 << 20
    max_tensors: int = 4096
    max_total_bytes: int = 64 << 30
    max_ndim: int = 8


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

    @classmethod
    def from_env(cls, **overrides: object) -> CheckpointOptions:
        """The configured signer (``CAIRN_SIGNING_KEY[_FILE]``) and default bounds."""
        return cls(signer=signer_from_env(), **overrides)  # type: ignore[arg-type]


def resolve_options(options: CheckpointOptions | None) -> CheckpointOptions:
    """``options``, or the configured ones (``from_env``) when a caller passed none."""
    return options if options is not None else CheckpointOptions.from_env()
