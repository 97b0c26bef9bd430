"""Where things live in a store: the one module that knows every key Cairn reads or writes.

::

    STORE/
      .cairn/store-id.json                  the store's identity            (cairn.runs.ownership)
      .cairn/registry/RUN/ENTRY.json        published models                (cairn.effects.registry)
      RUN/owners/SEQ.json                   claims: the latest names the run's trainer (cairn.runs.ownership)
      RUN/pins/NAME.json                    named pins                      (cairn.checkpoint.retention)
      RUN/lifecycle/SEQ.json                the run's lifecycle log: final-test exposures (cairn.runs.exposures)
      RUN/.preflight-NONCE.{object,commit}  a write probe, deleted at once   (cairn.runs.preflight)
      RUN/KIND/STEP/manifest.json           a committed checkpoint: the commit marker
      RUN/KIND/STEP/NONCE/rankRRR-NNNN.bin  its shards, named per save attempt and rank

STEP has ``STEP_DIGITS`` digits, so keys sort by step. Run ids start with a letter or a digit,
so nothing Cairn keeps for itself (under ``.cairn/``) can collide with a run — a run named
``registry`` is just a run. The checkpoint prefix ``RUN/KIND/STEP`` is also the checkpoint's
idempotency key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cairn.stores.numbered import numbered_key

__all__ = [
    "RUN_ID_PATTERN",
    "STEP_DIGITS",
    "MANIFEST_NAME",
    "RESERVED_PREFIX",
    "STORE_ID_KEY",
    "CheckpointKey",
    "run_prefix",
    "PROBE_MARK",
    "checkpoint_prefix",
    "manifest_key",
    "shard_key",
    "parse_checkpoint_key",
    "pins_prefix",
    "pin_key",
    "owner_key",
    "owners_prefix",
    "registry_prefix",
    "lifecycle_prefix",
    "lifecycle_key",
    "registry_entry_key",
]

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STEP_DIGITS = 12
MANIFEST_NAME = "manifest.json"
RESERVED_PREFIX = ".cairn/"
STORE_ID_KEY = f"{RESERVED_PREFIX}store-id.json"
_STEP = re.compile(rf"^[0-9]{{{STEP_DIGITS}}}$")
_KIND = re.compile(r"^[a-z]+$")


PROBE_MARK = ".preflight-"
"""Names of a store's write probes, directly under the run's prefix (deleted before the probe
returns; not a checkpoint key, so a probe a crash left behind is never read as one)."""


def run_prefix(run_id: str) -> str:
    """Everything of one run (checkpoints of every kind, pins, owner) is under this prefix."""
    return f"{run_id}/"


def checkpoint_prefix(run_id: str, kind: str, step: int) -> str:
    """The idempotency key of a checkpoint, as a store prefix (no trailing slash)."""
    return f"{run_id}/{kind}/{step:0{STEP_DIGITS}d}"


def manifest_key(run_id: str, kind: str, step: int) -> str:
    return f"{checkpoint_prefix(run_id, kind, step)}/{MANIFEST_NAME}"


def shard_key(nonce: str, rank: int, index: int) -> str:
    """A shard's key relative to its checkpoint prefix: ranks and attempts never collide."""
    return f"{nonce}/rank{rank:03d}-{index:04d}.bin"


@dataclass(frozen=True)
class CheckpointKey:
    """A key under a checkpoint prefix, split: ``RUN/KIND/STEP/REST``."""

    run_id: str
    kind: str
    step: int
    rest: str

    @property
    def is_manifest(self) -> bool:
        return self.rest == MANIFEST_NAME


def parse_checkpoint_key(key: str) -> CheckpointKey | None:
    """Split a store key that lies under a checkpoint prefix; None for any other key (pins,
    owner records, the store's own objects, stray files)."""
    parts = key.split("/", 3)
    if len(parts) != 4 or not parts[3]:
        return None
    run_id, kind, step, rest = parts
    if not RUN_ID_PATTERN.match(run_id) or not _KIND.match(kind) or not _STEP.match(step):
        return None
    return CheckpointKey(run_id=run_id, kind=kind, step=int(step), rest=rest)


def pins_prefix(run_id: str) -> str:
    return f"{run_id}/pins/"


def pin_key(run_id: str, name: str) -> str:
    return f"{pins_prefix(run_id)}{name}.json"


def owners_prefix(run_id: str) -> str:
    return f"{run_id}/owners/"


def owner_key(run_id: str, seq: int) -> str:
    """The ``seq``-th claim of a run (12 digits, so keys sort by number)."""
    return numbered_key(owners_prefix(run_id), seq)


def lifecycle_prefix(run_id: str) -> str:
    return f"{run_id}/lifecycle/"


def lifecycle_key(run_id: str, seq: int) -> str:
    """The ``seq``-th lifecycle event of a run (numbered, create-if-absent; checkpoints stay immutable)."""
    return numbered_key(lifecycle_prefix(run_id), seq)


def registry_prefix(run_id: str) -> str:
    return f"{RESERVED_PREFIX}registry/{run_id}/"


def registry_entry_key(run_id: str, digest: str) -> str:
    return f"{registry_prefix(run_id)}{digest}.json"
