"""Inputs and results of the TrainingRun workflow and its activities.

One pydantic model per workflow/activity input and result, so fields can be added without
breaking running workflows or old callers. Every model is plain JSON: a run can be started
from ``temporal workflow start --input-file examples/run.json`` or the Web UI's form. Payloads
carry references (store URLs, checkpoint references, fingerprints), never arrays.
"""

from __future__ import annotations

import os
import uuid
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from activities.effect_models import DecisionInput, EffectInput, EffectReceipt, EffectsSpec, Model
from activities.policy_models import CheckpointPolicy, RetentionSpec
from activities.tracker_models import MAX_TRACKERS, TrackerSpec
from cairn.checkpoint import RUN_ID_PATTERN, CompressionChoice
from cairn.checkpoint_interval import IntervalChoice, IntervalState
from cairn.config import TrainConfig
from cairn.numerics import DEFAULT_PROFILE, ProfileName
from cairn.runs import SegmentOutcome, store_url_problem

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "WORKFLOW_TYPE",
    "CheckpointPolicy",
    "RetentionSpec",
    "SegmentSpec",
    "DEFAULT_SEGMENT_SECONDS",
    "GANG_SEGMENT_STEPS",
    "EffectsSpec",
    "RunCarry",
    "TrainingRunInput",
    "SegmentInput",
    "TrainSegmentInput",
    "TrainSegmentResult",
    "GangNodeInput",
    "GangEndpointInput",
    "node_queue",
    "own_queue",
    "WORKER_ID",
    "WORKER_ID_ENV",
    "OpenRunInput",
    "OpenRunResult",
    "LatestCheckpointInput",
    "LatestCheckpointResult",
    "CollectInput",
    "EffectInput",
    "EffectReceipt",
    "DecisionInput",
    "RunInfo",
    "IntervalChoice",
]

DEFAULT_TASK_QUEUE = "cairn-training"
WORKFLOW_TYPE = "TrainingRun"


_Model = Model


ATTEMPTS_WINDOW = 32
"""How many recent segments' attempt counts a run carries (counters cover the rest)."""


class RunCarry(_Model):
    """What a TrainingRun hands to itself across continue-as-new. Bounded: counters and a
    fixed window, never a list that grows with the run."""

    step: int = 0
    checkpoint: str | None = None
    fingerprint: str | None = None
    durable_checkpoint: str | None = None
    durable_step: int = 0
    """The run's durable cursor (what a retry on another host resumes from): ``checkpoint`` may
    be ahead of it while a node-local tier uploads."""
    store_id: str | None = None
    """Identity of the store the run started on (``cairn.runs``); every activity checks it."""
    segments: int = 0
    """Segments finished (completed or interrupted after committing) over the whole run."""
    retried_segments: int = 0
    """Segments that needed more than one attempt."""
    attempts: list[int] = Field(default_factory=list)
    """Attempts of the last ``ATTEMPTS_WINDOW`` segments, oldest first."""
    recomputed_steps: int = 0
    continued_as_new: int = 0
    loss: float | None = None
    paused: bool = False
    stop_requested: bool = False
    reservation: EffectReceipt | None = None
    effects: dict[str, str] = Field(default_factory=dict)
    resume_from: str | None = None
    """A checkpoint the next segment must resume from (set by a rollback)."""
    compression: CompressionChoice | None = None
    """The latest segment's compression decision (``RunSummary.compression``)."""
    replay_until: int | None = None
    """After a rollback: the step the run had reached before it. Until the run is back there,
    each segment resumes from the commit the previous one made (``run_state.replay_resume``):
    the run's latest commit is still a pre-rollback one, past the segment's target."""
    rollbacks: int = 0
    total_steps: int | None = None
    """The run's length in updates (resolved from ``total_epochs`` when given in epochs)."""
    steps_per_epoch: int | None = None
    reproducibility: str | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    world_size: int | None = None
    """The gang's current world size, when an elastic run shrank it (None: the input's)."""
    nodes: list[str] | None = None
    """The gang's current nodes, when an elastic run shrank it (None: the input's)."""
    numerics_id: str | None = None
    """The numerics profile id segments are routed by (``OpenRunResult.numerics_id``)."""
    warm_queue: str | None = None
    """The own task queue of the worker that holds the run's state in memory (its last segment
    completed there): the next segment is offered to it first."""
    interval: IntervalState | None = None
    """What ``checkpoint.every: "auto"`` has measured and chosen so far."""
    lost: tuple[int | None, int] | None = None
    """(reached step, attempts) of a segment whose attempt was lost on the warm worker's queue
    and that was not picked up there again: its re-offer carries them on (``TrainSegmentInput``)."""

    @field_validator("attempts")
    @classmethod
    def _bounded_window(cls, value: list[int]) -> list[int]:
        return value[-ATTEMPTS_WINDOW:]

    def record_segment(self, attempt: int) -> None:
        self.segments += 1
        self.retried_segments += int(attempt > 1)
        self.attempts = [*self.attempts, attempt][-ATTEMPTS_WINDOW:]


class SegmentSpec(_Model):
    """How much training one segment activity does: ``steps`` updates, ``epochs`` whole epochs
    (a segment then ends on an epoch boundary, so the workflow drives epochs), or ``seconds``
    (a segment ends at the first step boundary past that many seconds, with a checkpoint)."""

    steps: Annotated[int, Field(gt=0)] | None = None
    """Updates per segment."""
    epochs: Annotated[int, Field(gt=0, le=10**6)] | None = None
    """Whole epochs per segment (segments end on epoch boundaries)."""
    seconds: Annotated[float, Field(gt=0, le=86_400)] | None = None
    """Seconds of training per segment, ended at the next step boundary (in-process runs only, not gangs)."""

    @model_validator(mode="after")
    def _one_unit(self) -> SegmentSpec:
        if sum(v is not None for v in (self.steps, self.epochs, self.seconds)) != 1:
            raise ValueError("give exactly one of steps, epochs or seconds")
        return self


DEFAULT_SEGMENT_SECONDS = 30.0
"""A segment's length when the run input names none: long enough that a segment boundary
costs a negligible share of it whatever the step time (a gang: ``GANG_SEGMENT_STEPS``)."""
GANG_SEGMENT_STEPS = 50


NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


def node_queue(task_queue: str, node: str) -> str:
    """The task queue of the worker on ``node`` (``cairn worker --node NODE`` polls it): a
    gang's per-node activity is routed to that host this way."""
    return f"{task_queue}@{node}"


WORKER_ID_ENV = "CAIRN_WORKER_ID"
WORKER_ID = os.environ.get(WORKER_ID_ENV) or uuid.uuid4().hex[:12]
"""This worker process's id (a supervisor passes the same id to the worker it restarts)."""
OWN_QUEUE_MARK = "#w-"


def own_queue(task_queue: str, worker_id: str = WORKER_ID) -> str:
    """This worker's own queue beside ``task_queue`` (it polls both): the next segment of a
    run whose state it holds in memory is offered there first (``cairn.runs.warm``)."""
    return f"{task_queue.split(OWN_QUEUE_MARK)[0]}{OWN_QUEUE_MARK}{worker_id}"


class TrainingRunInput(_Model):
    """A run file: the TrainingRun workflow's input. Exactly one of ``total_steps`` and ``total_epochs``."""

    run_id: Annotated[str, Field(pattern=RUN_ID_PATTERN.pattern)]
    """Names the run and its checkpoints; a run whose id already has checkpoints continues from the latest."""
    config: TrainConfig
    """The trainer config: everything that defines the run's arithmetic."""
    total_steps: Annotated[int, Field(ge=0, le=10**12)] | None = None
    """Updates to train in all; or give ``total_epochs`` instead."""
    total_epochs: Annotated[int, Field(ge=0, le=10**6)] | None = None
    """Epochs to train in all (the trainer says how many updates an epoch is)."""
    store: str
    """An absolute directory every worker sees, or ``s3://bucket/prefix`` (``cairn run start`` resolves a
    relative path against its working directory)."""
    steps_per_segment: Annotated[int, Field(gt=0)] | None = None
    """Segment size in steps (the same as ``"segment": {"steps": N}``)."""
    segment: SegmentSpec | None = None
    """Segment size in steps, epochs or seconds (``{"epochs": 1}``); overrides
    ``steps_per_segment``. Neither: 30-second segments (a gang: 50 steps)."""
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    """When and how checkpoints are committed."""
    retention: RetentionSpec | None = RetentionSpec()
    """Which checkpoints are kept; null: every checkpoint is kept."""
    segments_per_run: Annotated[int, Field(gt=0)] = 20
    """Continue-as-new after this many segments, so each run's history stays bounded."""
    heartbeat_timeout_seconds: Annotated[float, Field(ge=1, le=300)] = 10.0
    """Heartbeat timeout of the run's activities: how soon a dead or frozen worker is detected."""
    segment_timeout_seconds: Annotated[float, Field(gt=0)] = 3600.0
    """Start-to-close timeout of each segment activity; ``checkpoint.every: "auto"`` never picks an interval
    longer than half of it."""
    throttle_seconds_per_step: Annotated[float, Field(ge=0, le=10)] = 0.0
    """Sleep after each step: pacing for demos and drills (simulates a heavier model)."""
    effects: EffectsSpec | None = None
    """External side effects (reserve before, publish on success, release at the end); null: none."""
    trackers: list[TrackerSpec] = Field(default_factory=list, max_length=MAX_TRACKERS)
    """Experiment trackers (TensorBoard, MLflow, W&B) fed from the committed history beside each
    segment and at the end, each committed step exactly once; empty: none."""
    world_size: Annotated[int, Field(ge=1, le=1024)] = 1
    """Ranks of a data-parallel run (``config.distributed``): each segment runs as a gang of
    this many rank processes under torchrun. Any divisor of ``distributed.microbatches`` gives
    the same bits, so a run may continue at another world size (start it again with the same
    ``run_id``)."""
    min_world_size: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Elastic: after 2 failed gang attempts in a row, the run goes on at half the world size (on
    the first half of ``nodes``), down to this; the bits do not change. null: the world size is fixed."""
    nodes: list[Annotated[str, Field(pattern=NODE_NAME)]] = Field(default_factory=list, max_length=256)
    """Hosts of the gang, by the name their worker polls (``cairn worker --node NAME``): one
    gang activity per node, ``world_size / len(nodes)`` ranks each. Empty: one node, any
    worker of the run's task queue."""
    numerics: ProfileName = DEFAULT_PROFILE
    """The numerics profile every segment is computed under (``x86-64-v3``: any AVX2 or AVX-512
    machine computes the same bits): segments go only to workers of that profile
    (``cairn worker --numerics``). ``native``: no pinning, bit-exact only on identical machines."""
    carry: RunCarry | None = None
    """Internal: set by continue-as-new. Leave empty when starting a run."""

    @field_validator("store")
    @classmethod
    def _store_is_absolute(cls, value: str) -> str:
        problem = store_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_total(self) -> TrainingRunInput:
        if (self.total_steps is None) == (self.total_epochs is None):
            raise ValueError("give exactly one of total_steps or total_epochs")
        return self

    @model_validator(mode="after")
    def _gang_fits(self) -> TrainingRunInput:
        w, nodes, dist = self.world_size, self.nodes, self.config.distributed
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"nodes must be distinct (found {nodes})")
        if nodes and w % len(nodes):
            raise ValueError(
                f"world_size must be a multiple of len(nodes) (expected a multiple of {len(nodes)}, found {w})"
            )
        if (w > 1 or nodes) and self.segment is not None and self.segment.seconds is not None:
            raise ValueError("segment.seconds needs an in-process run (expected world_size 1 and no nodes)")
        if (w > 1 or nodes) and dist is None:
            raise ValueError(f"world_size {w} needs config.distributed (expected a 'distributed' section, found none)")
        if dist is not None and dist.microbatches % w:
            m = dist.microbatches
            sizes = [d for d in range(1, m + 1) if m % d == 0]
            raise ValueError(
                f"world_size must divide config.distributed.microbatches ({m}) (expected one of {sizes}, found {w})"
            )
        if self.min_world_size is not None:
            halvings = [w >> k for k in range(w.bit_length()) if (w >> k) << k == w]  # w, w/2, ... while exact
            if self.min_world_size not in halvings:
                raise ValueError(
                    "min_world_size must be reachable by halving world_size "
                    f"(expected one of {halvings}, found {self.min_world_size})"
                )
        return self

    @property
    def gang(self) -> bool:
        """Segments run as a gang of rank processes (not in the activity's own thread)."""
        return self.world_size > 1 or bool(self.nodes)


class OpenRunInput(_Model):
    run_id: str
    store: str
    workflow_id: str
    store_id: str | None = None
    """Known after continue-as-new: the store must still be that one."""
    config: TrainConfig | None = None
    """The run's config: its trainer is loaded once here, so a worker without the trainer's
    package fails the run at once (non-retryable) instead of looping on segments."""
    numerics: str | None = None
    """The run's numerics profile (``TrainingRunInput.numerics``)."""


class OpenRunResult(_Model):
    store_id: str
    checkpoint: str | None
    step: int
    fingerprint: str | None
    steps_per_epoch: int | None = None
    trainer: str | None = None
    reproducibility: str | None = None
    numerics_id: str | None = None
    """The numerics profile id the run's segments are routed by (``cairn.numerics``): its latest
    checkpoint's, else the run's profile on this worker's libraries. None: an older worker."""


class SegmentInput(_Model):
    """What every training activity is told: the run, its store, where to train to."""

    run_id: str
    config: TrainConfig
    store: str
    store_id: str | None = None
    target_step: int
    resume_from: str | None = None
    """Resume from this checkpoint instead of the latest committed one (a rollback)."""
    numerics_id: str | None = None
    """The numerics profile id this segment must be computed under (None: not checked)."""
    checkpoint_every: int
    throttle_seconds_per_step: float = 0.0
    heartbeat_every_seconds: float = 0.2
    """Local bound on heartbeat calls; the SDK further throttles what goes over the network
    (about once a second), so the server's view of a segment's step is at most ~1 s stale."""
    max_seconds: float | None = None
    """End the segment at the first step boundary past this many seconds of training (with a
    checkpoint), before ``target_step`` if need be; None: train to ``target_step``."""
    incremental: bool | None = None
    """Incremental saves (``CheckpointPolicy.incremental``); None: the worker's setting."""
    compression: Literal["off", "zstd", "auto"] | None = None
    """``CheckpointPolicy.compression``; None: the worker's setting."""


class TrainSegmentInput(SegmentInput):
    """A segment trained in the worker's own process."""

    async_save: bool = False
    reached_before: int | None = None
    """How far an earlier activity of this segment got: one offered to the warm worker's queue
    whose attempt was lost there, re-offered to every worker (``prior_attempts`` counts it)."""
    prior_attempts: int = 0
    final: bool = False
    """This segment ends the run: with a node-local tier it waits for its checkpoint's upload
    before it reports, so the run's result is durable."""


class GangEndpointInput(_Model):
    run_id: str


class GangNodeInput(SegmentInput):
    """One node's share of a gang segment: ``nproc`` rank processes under torchrun."""

    world_size: int
    nnodes: int = 1
    node_index: int = 0
    rendezvous: str | None = None
    """``HOST:PORT`` of node 0's rendezvous store (``gang_endpoint``); None on one node."""
    rdzv_id: str
    attempt: int = 1
    """The gang's attempt at this segment (the workflow retries whole gangs)."""
    reached_before: int | None = None
    """The furthest step an earlier attempt of this segment reported (for recomputed steps)."""


class TrainSegmentResult(SegmentOutcome, _Model):
    """A segment's outcome (``cairn.runs.outcome``), as the workflow records it."""

    attempt: int
    recomputed_steps: int
    """Steps previous attempts had computed past the checkpoint this attempt resumed from,
    redone here: the furthest step any earlier attempt reported (its last heartbeat, at most
    ``HEARTBEAT_THROTTLE`` stale, or the checkpoints it committed) minus the resume step."""
    warm: bool = False
    """The segment continued from the worker's memory (no restore): see ``cairn.runs.warm``."""
    saves: int = 0
    blocked_save_seconds: float = 0.0
    """Checkpoints this attempt committed and the seconds they blocked training."""
    train_seconds: float = 0.0
    """This attempt's training time, its saves excluded."""
    worker_queue: str | None = None
    """The own task queue of the worker that ran it, which now holds the run's state."""
    compression: CompressionChoice | None = None
    """Whether this attempt's latest save compressed, and the figures ``auto`` decided from."""
    durable_checkpoint: str | None = None
    durable_step: int | None = None
    """The run's durable cursor when it reported: its latest commit in the durable store. With
    a node-local tier ``checkpoint`` may be committed on the worker's host only, its upload
    pending; None here: an older worker (the same as ``checkpoint``)."""


class LatestCheckpointInput(_Model):
    run_id: str
    store: str
    store_id: str | None = None
    at_or_before: int | None = None
    """Only consider checkpoints at or before this step (a rollback target)."""


class LatestCheckpointResult(_Model):
    checkpoint: str | None
    step: int
    fingerprint: str | None
    loss: float | None = None


class CollectInput(_Model):
    run_id: str
    store: str
    store_id: str | None = None
    retention: RetentionSpec


class RunInfo(_Model):
    run_id: str
    store: str
    registry: str | None = None


RunCarry.model_rebuild()
