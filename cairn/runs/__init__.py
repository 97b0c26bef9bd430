"""A run's records in its store and its sessions between segments, the top of the library beside
the gang.

Modules: ``ownership`` (absolute store URLs, the store the run started on, which workflow trains
the run), ``preflight`` (what a run needs of its store before its first step), ``record`` (the
loss/lr history and the committed checkpoints, as reports read them), ``restore`` (where a
segment's state comes from: memory, a rollback, the local tier, the durable store or step 0),
``tier_restore`` (where a segment resumes from when its worker has a node-local tier), ``warm``
(the training sessions a worker keeps in memory between a run's segments), ``outcome`` (how a
segment ended, as the activity and a gang's ranks report it).
"""

from cairn.runs.outcome import SegmentOutcome
from cairn.runs.ownership import (
    OwnerRecord,
    claim_run,
    read_owner,
    require_run_owner,
    require_store_identity,
    resolve_store_url,
    store_url_problem,
)
from cairn.runs.preflight import require_same_config, require_writable
from cairn.runs.record import CommitPoint, RunRecord, SegmentAttempt, TimelineEvent, run_record
from cairn.runs.restore import RestoreSource, choose_restore, require_not_past
from cairn.runs.tier_restore import resume_tiered
from cairn.runs.warm import WarmRuns, warm_key

__all__ = [
    "CommitPoint",
    "OwnerRecord",
    "RestoreSource",
    "RunRecord",
    "SegmentAttempt",
    "SegmentOutcome",
    "TimelineEvent",
    "WarmRuns",
    "choose_restore",
    "claim_run",
    "read_owner",
    "require_not_past",
    "require_run_owner",
    "require_same_config",
    "require_store_identity",
    "require_writable",
    "resolve_store_url",
    "resume_tiered",
    "run_record",
    "store_url_problem",
    "warm_key",
]
