"""Where things live in a store: the one module that knows every key Cairn reads or writes (but
the store's own identity, kept by the store: ``cairn.stores.identity``).

::

    STORE/
      .cairn/store-id.json                  the store's identity            (cairn.stores.identity)
      .cairn/registry/RUN/ENTRY.json        published models                (cairn.effects.registry)
      RUN/owners/SEQ.json                   claims: the latest names the run's trainer (cairn.runs.ownership)
      RUN/pins/NAME.json                    named pins                      (cairn.checkpoint.retention)
      RUN/history/KEY/START-END-HASH.bin    history segments, shared by checkpoints (cairn.checkpoint.history)
      RUN/lifecycle/SEQ.json                the run's lifecycle log: final-test exposures (cairn.checkpoint.exposures)
      RUN/trackers/SINK/SEQ.json            an experiment tracker's cursor: what it confirmed (cairn.trackers.cursor)
      RUN/.preflight-NONCE.{object,commit}  a write probe, deleted at once   (cairn.runs.preflight)
      RUN/KIND/STEP/manifest.json           a committed checkpoint: the commit marker
      RUN/KIND/STEP/NONCE/rankRRR-NNNN.bin  its shards, named per save attempt and rank
      RUN/KIND/STEP/NONCE/rankRRR.index.json  a rank's index of its blocks (format v3)
      RUN/intents/SAVE-rRRR-KIND-STEP-NONCE  a save will reference that attempt's shards (cairn.checkpoint.intents)
      RUN/KIND/latest.json                  advisory pointer to the latest step (cairn.checkpoint.latest)

STEP has ``STEP_DIGITS`` digits, so keys sort by step. Run ids start with a letter or a digit,
so nothing Cairn keeps for itself (under ``.cairn/``) can collide with a run — a run named
``registry`` is just a run. The checkpoint prefix ``RUN/KIND/STEP`` is also the checkpoint's
idempotency key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cairn.stores.identity import RESERVED_PREFIX
from cairn.stores.numbered import numbered_key

__all__ = [
    "RUN_ID_PATTERN",
    "STEP_DIGITS",
    "MANIFEST_NAME",
    "CheckpointKey",
    "run_prefix",
    "PROBE_MARK",
    "checkpoint_prefix",
    "manifest_key",
    "shard_key",
    "index_key",
    "attempt_prefix",
    "linked_shard",
    "shard_object_key",
    "intents_prefix",
    "intent_key",
    "parse_intent_key",
    "parse_checkpoint_key",
    "pins_prefix",
    "pin_key",
    "owner_key",
    "owners_prefix",
    "registry_prefix",
    "lifecycle_prefix",
    "trackers_prefix",
    "lifecycle_key",
    "registry_entry_key",
    "HISTORY_NAME_PATTERN",
    "history_prefix",
    "history_segment_key",
    "parse_history_segment_key",
    "LATEST_NAME",
    "latest_key",
    "steps_after",
    "MAX_PIN_BYTES",
    "history_segment_bytes",
]

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STEP_DIGITS = 12
MANIFEST_NAME = "manifest.json"
_STEP = re.compile(rf"^[0-9]{{{STEP_DIGITS}}}$")
_KIND = re.compile(r"^[a-z]+$")


MAX_PIN_BYTES = 4 << 10
"""``RUN/pins/NAME.json``: a kind and a step (~40 bytes)."""
# ``latest.json`` and the store's identity: ``cairn.stores.objects.MAX_POINTER_BYTES``; owner claims, lifecycle
# events, registry entries, the tier's record: ``cairn.stores.objects.MAX_RECORD_BYTES``.
# The bounds of the other objects are the checkpoint's own: a manifest's is ``Limits.max_manifest_bytes``,
# a rank index's and a history segment's the exact size the (checked) manifest declares for it.

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


def index_key(nonce: str, rank: int) -> str:
    """A rank's index object (format v3), relative to its checkpoint prefix, beside its shards."""
    return f"{nonce}/rank{rank:03d}.index.json"


def attempt_prefix(run_id: str, kind: str, step: int, nonce: str) -> str:
    """Everything one save attempt wrote (every rank's shards and indexes) is under this prefix."""
    return f"{checkpoint_prefix(run_id, kind, step)}/{nonce}/"


_SHARD_NAME = re.compile(r"^rank[0-9]{3,}-[0-9]{4,}\.bin$")
_NONCE = re.compile(r"^[0-9a-f]{16}$")


def linked_shard(key: str, run_id: str, kind: str, step: int | None) -> CheckpointKey | None:
    """``key`` split, when it names a shard of *another* checkpoint (not ``step``; None: any)
    of the same run and kind (``RUN/KIND/STEP/NONCE/rankRRR-NNNN.bin``, a full store key): what
    an incremental save's rank index may reference (``cairn.checkpoint.reuse``). None for any
    other key — another run's, another kind's, this checkpoint's own, an index object, ..."""
    found = parse_checkpoint_key(key)
    if found is None or found.run_id != run_id or found.kind != kind or found.step == step:
        return None
    nonce, sep, name = found.rest.partition("/")
    if not sep or not _NONCE.match(nonce) or not _SHARD_NAME.match(name):
        return None
    return found


def shard_object_key(run_id: str, kind: str, step: int, key: str, *, indexed: bool) -> str:
    """The store key of shard ``key`` as a manifest of checkpoint (run, kind, step) names it:
    relative to its prefix, or — in a v3 (``indexed``) checkpoint — a linked shard's full key."""
    if indexed and linked_shard(key, run_id, kind, step) is not None:
        return key
    return f"{checkpoint_prefix(run_id, kind, step)}/{key}"


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


def intents_prefix(run_id: str) -> str:
    """Every live save's intents to reference other checkpoints' shards (``cairn.checkpoint.intents``)."""
    return f"{run_id}/intents/"


def intent_key(run_id: str, save: str, rank: int, kind: str, step: int, nonce: str) -> str:
    """Save attempt ``save`` (its nonce), rank ``rank``, is about to reference shards of the
    attempt ``RUN/KIND/STEP/NONCE/``. Flat (three segments), so never taken for a checkpoint key."""
    return f"{intents_prefix(run_id)}{save}-r{rank:03d}-{kind}-{step:0{STEP_DIGITS}d}-{nonce}"


_INTENT = re.compile(rf"^([0-9a-f]{{16}})-r([0-9]{{3,}})-([a-z]+)-([0-9]{{{STEP_DIGITS}}})-([0-9a-f]{{16}})$")


def parse_intent_key(key: str) -> tuple[str, str] | None:
    """(the intending save's nonce, the attempt prefix ``RUN/KIND/STEP/NONCE/`` it protects) of
    an intent key; None for any other key."""
    run_id, sep, name = key.partition("/intents/")
    found = _INTENT.match(name) if sep and RUN_ID_PATTERN.match(run_id) else None
    if found is None:
        return None
    return found[1], f"{checkpoint_prefix(run_id, found[3], int(found[4]))}/{found[5]}/"


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


def trackers_prefix(run_id: str, sink: str) -> str:
    """Where an experiment tracker's cursor log of ``run_id`` lives (``sink``: its kind and a digest)."""
    return f"{run_prefix(run_id)}trackers/{sink}/"


def lifecycle_key(run_id: str, seq: int) -> str:
    """The ``seq``-th lifecycle event of a run (numbered, create-if-absent; checkpoints stay immutable)."""
    return numbered_key(lifecycle_prefix(run_id), seq)


def registry_prefix(run_id: str) -> str:
    return f"{RESERVED_PREFIX}registry/{run_id}/"


def registry_entry_key(run_id: str, digest: str) -> str:
    return f"{registry_prefix(run_id)}{digest}.json"


LATEST_NAME = "latest.json"


def latest_key(run_id: str, kind: str) -> str:
    """The advisory latest pointer of a run's checkpoints of one kind (``cairn.checkpoint.latest``).

    It lies directly under ``RUN/KIND/`` and is not a step, so ``parse_checkpoint_key`` (and with
    it listing and retention) never takes it for a checkpoint key."""
    return f"{run_id}/{kind}/{LATEST_NAME}"


def steps_after(run_id: str, kind: str, step: int) -> str:
    """A ``start_after`` bound for ``Store.list``: every key of a step above ``step`` sorts after
    it, every key of ``step`` and below sorts before ('/' < '0', and steps have a fixed width).
    It names no object or folder (13 digits), which SeaweedFS's ``StartAfter`` needs."""
    return f"{checkpoint_prefix(run_id, kind, step)}0"


HISTORY_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""History keys (``loss``, ``lr``, ``val_<metric>``): they start with a letter, so a segment key
``RUN/history/KEY/...`` never has a step where ``parse_checkpoint_key`` looks for one."""
_SEGMENT = re.compile(r"^([0-9]{12})-([0-9]{12})-([0-9a-f]{64})\.bin$")


def history_prefix(run_id: str) -> str:
    """Every history segment of a run is under this prefix (``cairn.checkpoint.history``)."""
    return f"{run_id}/history/"


def history_segment_key(run_id: str, name: str, start: int, end: int, digest: str) -> str:
    """The segment holding entries ``[start, end)`` of history key ``name`` whose bytes have the
    BLAKE3 hex ``digest``: the same values always have the same key."""
    return f"{history_prefix(run_id)}{name}/{start:012d}-{end:012d}-{digest}.bin"


def history_segment_bytes(start: int, end: int) -> int:
    """The exact size of the segment holding entries ``[start, end)`` (little-endian float64)."""
    return 8 * (end - start)


def parse_history_segment_key(key: str) -> tuple[str, str, int, int, str] | None:
    """(run id, history key, start, end, digest) of a segment key; None for any other key."""
    parts = key.split("/")
    if len(parts) != 4 or parts[1] != "history":
        return None
    found = _SEGMENT.match(parts[3])
    if not RUN_ID_PATTERN.match(parts[0]) or not HISTORY_NAME_PATTERN.match(parts[2]) or found is None:
        return None
    return parts[0], parts[2], int(found[1]), int(found[2]), found[3]
