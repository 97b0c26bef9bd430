"""What a recovery drill does: its spec (``DrillSpec``) and its seeded fault schedule.

Pure and deterministic: the same spec (seed included) gives the same schedule, fault for fault.
A fault fires ``gap_steps`` training steps after the previous one (after the start for the
first), and never before training has resumed from the previous one, so the schedule is stated
in the run's own, deterministic, step numbers; the wall times it lands at are measured, not
planned.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cairn.config import config_error_from

__all__ = [
    "FAULT_TARGETS",
    "WORKER_FAULTS",
    "SERVER_FAULTS",
    "DEFAULT_TARGETS",
    "DrillSpec",
    "PlannedFault",
    "plan_schedule",
    "drill_spec",
    "default_total_steps",
]

FaultTarget = Literal[
    "worker-kill",
    "kill-in-upload",
    "kill-after-effect",
    "sigterm",
    "temporal-restart",
    "s3-restart",
    "service-restart",
    "storage-brownout",
    "freeze",
]
FAULT_TARGETS: tuple[str, ...] = FaultTarget.__args__  # type: ignore[attr-defined]
WORKER_FAULTS = ("worker-kill", "kill-in-upload", "kill-after-effect", "sigterm")
"""Faults that take a worker away (a replacement is started at once, as a supervisor would)."""
FREEZE_MARGIN_S = 1.5
"""A ``freeze`` lasts until the segment resumed on another worker, and at least the heartbeat
timeout plus this: the thawed process's attempt has then certainly been superseded (its stall
outlasted the heartbeat timeout by more than the attempt's own margin, ``activities.edge``)."""
SERVER_FAULTS = ("temporal-restart", "s3-restart", "service-restart")
DEFAULT_TARGETS: tuple[str, ...] = ("worker-kill", "kill-in-upload", "sigterm", "temporal-restart")
EFFECT_POINTS = ("reserve", "publish")
"""Where ``kill-after-effect`` crashes: after the service committed, before the completion."""


class DrillSpec(BaseModel):
    """A drill's input: ``cairn drill``'s flags, or a JSON object with the same fields."""

    model_config = ConfigDict(extra="forbid")

    seed: Annotated[int, Field(ge=0, lt=2**63)] = 1
    kills: Annotated[int, Field(ge=1, le=200)] = 5
    """Faults in the schedule (every target's fault counts, not only kills)."""
    duration_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = None
    """Length of the drilled run's training, uninterrupted; None: long enough for the faults."""
    targets: Annotated[list[FaultTarget], Field(min_length=1)] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS)  # type: ignore[arg-type]
    )
    workers: Annotated[int, Field(ge=1, le=8)] = 2
    stack: Literal["embedded", "env"] = "embedded"
    """``embedded``: the drill starts (and kills) its own Temporal, SeaweedFS and reservation
    service; ``env``: the stack named by TEMPORAL_ADDRESS / AWS_ENDPOINT_URL_S3 /
    CAIRN_RESERVATION_URL (server restarts are then not possible)."""
    store: str | None = None
    """``s3://bucket/prefix`` or an absolute directory; default: the embedded S3 bucket."""
    config: str | None = None
    """Trainer config file (default examples/config.json)."""
    run: str | None = None
    """A run input file (``cairn run start``'s); its run id, store and effects are the drill's."""
    checkpoint_every: Annotated[int, Field(ge=1)] = 10
    steps_per_segment: Annotated[int, Field(ge=1)] = 60
    step_seconds: Annotated[float, Field(ge=0, le=10)] = 0.02
    """Pacing per step (the run's ``throttle_seconds_per_step``): how heavy the model feels."""
    heartbeat_timeout_seconds: Annotated[float, Field(ge=1, le=300)] = 3.0
    brownout_rate: Annotated[float, Field(gt=0, le=1)] = 0.3
    brownout_seconds: Annotated[float, Field(gt=0, le=600)] = 3.0
    worker_module: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")] = "workers.worker"
    """The Python module the drill runs as each worker (``python -m MODULE``)."""
    web_ui: bool = True
    """Start the embedded Temporal server with its Web UI (its link is printed with ``keep_stack``)."""
    keep_stack: bool = False
    """Leave the embedded stack running after the drill (its servers, their data, the Web UI),
    and print its Web UI link and how to stop it; otherwise it is deleted on exit and no link
    to it is printed."""

    @field_validator("targets")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


def drill_spec(data: dict[str, object], where: str = "drill") -> DrillSpec:
    """Validate a drill's input; a bad field is one ``ConfigError`` naming it."""
    try:
        return DrillSpec.model_validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, where, DrillSpec) from None


@dataclass(frozen=True)
class PlannedFault:
    index: int
    kind: str
    gap_steps: int
    """Steps after the previous fault's step (or the start) at which this one fires (and at
    least a few steps after the previous one recovered); ``kill-after-effect`` fires where its
    effect runs instead."""
    param: str = ""
    """``kill-after-effect``: the effect (reserve, publish); ``storage-brownout``: seconds."""
    phase: float = 0.0
    """Where inside a checkpoint interval it lands: it fires ``phase`` x interval after its
    step is seen (the server sees a segment's step at each commit, so without this every
    fault would land just after a commit)."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _gap_bounds(spec: DrillSpec) -> tuple[int, int]:
    every = spec.checkpoint_every
    return every + 3, 3 * every + 7


def plan_schedule(spec: DrillSpec) -> list[PlannedFault]:
    """The seeded fault schedule: every target at least once (when ``kills`` allows), the
    rest drawn from the targets, in a seeded order; seeded gaps between faults."""
    rng = random.Random(spec.seed)
    targets = list(spec.targets)
    kinds = rng.sample(targets, k=min(len(targets), spec.kills))
    kinds += [rng.choice(targets) for _ in range(spec.kills - len(kinds))]
    rng.shuffle(kinds)
    lo, hi = _gap_bounds(spec)
    planned: list[PlannedFault] = []
    effect_kill: PlannedFault | None = None
    for kind in kinds:
        gap = rng.randint(lo, hi)
        if kind == "kill-after-effect":
            if effect_kill is not None:  # one crash point per drill: the hook fires once
                kind = "worker-kill"
            else:
                effect_kill = PlannedFault(0, kind, 0, rng.choice(EFFECT_POINTS))
                continue
        param = f"{rng.uniform(0.5, 1.0) * spec.brownout_seconds:.2f}" if kind == "storage-brownout" else ""
        planned.append(PlannedFault(0, kind, gap, param))
    if effect_kill is not None:  # the reserve crash happens before training, publish after it
        planned = [effect_kill, *planned] if effect_kill.param == "reserve" else [*planned, effect_kill]
    phases = random.Random(spec.seed + 1)  # a stream of its own: the kinds and gaps above stay put
    return [
        PlannedFault(
            i + 1, f.kind, f.gap_steps, f.param, 0.0 if f.kind == "kill-after-effect" else round(phases.random(), 3)
        )
        for i, f in enumerate(planned)
    ]


def default_total_steps(spec: DrillSpec, schedule: list[PlannedFault]) -> int:
    """Steps of the drilled run: the duration asked for, else room for every gap and a tail."""
    if spec.duration_seconds is not None:
        per_step = max(spec.step_seconds, 0.001)
        return max(2 * spec.checkpoint_every, int(spec.duration_seconds / per_step))
    # A fault lands a little past its step (its phase): room for that, then a tail. Training also
    # goes on while a brown-out lasts and while a server restarts and is seen back: at most
    # (those seconds / the step's pacing) steps each, which the gaps do not count, so without
    # them a long brown-out could let the run end before the last fault's moment.
    per_step = max(spec.step_seconds, 0.001)
    during = sum(math.ceil(_fault_seconds(f) / per_step) for f in schedule)
    return sum(f.gap_steps for f in schedule) + during + 2 * spec.checkpoint_every * (len(schedule) + 1) + 20


SERVER_RESTART_ALLOWANCE_S = 2.0
"""Time a server restart takes from the kill until training is seen moving again (measured on
the embedded stack: down 0.2-0.3 s, progress seen 0.1-0.5 s later; doubled and rounded up)."""


def _fault_seconds(fault: PlannedFault) -> float:
    """How long training keeps running through a fault before the next one may be scheduled."""
    if fault.kind == "storage-brownout":
        return float(fault.param)
    if fault.kind in SERVER_FAULTS:
        return SERVER_RESTART_ALLOWANCE_S
    return 0.0  # a worker fault stops training until the retry resumes it
