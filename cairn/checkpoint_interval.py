"""How often to checkpoint: the Young/Daly trade-off between save cost and lost work.

Saving often costs I/O; saving rarely loses more work per failure. With a save cost ``C``
(seconds per checkpoint), a mean time between failures ``M`` (seconds) and a restart cost
``R`` (detection + restore, seconds), a run that checkpoints every ``T`` seconds of training
wastes, to first order (Young 1974, Daly 2006)::

    overhead(T) = C / T  +  (T / 2 + R) / M        (fraction of useful time)

the first term is the saves, the second the expected work redone (half an interval on
average) and the restart, per failure. It is smallest at ``T* = sqrt(2 C M)``; Daly's
refinement ``sqrt(2 C M) - C`` differs only when ``C`` is not small against ``M``.
Lost work per failure is ``T / 2`` on average and at most ``T``.

Pure arithmetic, no I/O: ``cairn plan-interval`` and the drill's report both call ``advise``;
a run with ``checkpoint.every: "auto"`` carries an ``IntervalState`` that ``observe`` feeds with
what each segment measured and ``choose`` turns into the next segment's interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cairn.errors import ConfigError

__all__ = [
    "IntervalAdvice",
    "young_daly_seconds",
    "daly_seconds",
    "expected_overhead",
    "expected_lost_seconds",
    "advise",
    "AutoInterval",
    "IntervalChoice",
    "IntervalState",
    "CHOICES_WINDOW",
    "mtbf_estimate",
]


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, expected="a finite number >= 0" if allow_zero else "a finite number > 0", found=value)
    return float(value)


def young_daly_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum interval between checkpoints, ``sqrt(2 C M)`` seconds of training."""
    c = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * c * m)


def daly_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's first-order refinement, ``sqrt(2 C M) - C`` (never below ``C``)."""
    return max(young_daly_seconds(save_seconds, mtbf_seconds) - save_seconds, save_seconds)


def expected_overhead(
    interval_seconds: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0
) -> float:
    """Fraction of useful time spent saving, redoing lost work and restarting."""
    t = _positive("interval_seconds", interval_seconds)
    c = _positive("save_seconds", save_seconds, allow_zero=True)
    m = _positive("mtbf_seconds", mtbf_seconds)
    r = _positive("restart_seconds", restart_seconds, allow_zero=True)
    return c / t + (t / 2.0 + r) / m


def expected_lost_seconds(interval_seconds: float) -> float:
    """Training time redone per failure, on average: half an interval."""
    return _positive("interval_seconds", interval_seconds) / 2.0


@dataclass(frozen=True)
class IntervalAdvice:
    """The optimum next to what the run used, in seconds and in steps."""

    save_seconds: float
    mtbf_seconds: float
    step_seconds: float
    restart_seconds: float
    optimum_seconds: float
    optimum_steps: int
    """The optimum rounded to whole steps (at least 1)."""
    optimum_overhead: float
    optimum_lost_steps: float
    """Steps redone per failure, on average, at the optimum."""
    current_steps: int | None
    current_seconds: float | None
    current_overhead: float | None
    current_lost_steps: float | None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def lines(self) -> list[str]:
        """A few lines for people."""
        out = [
            f"save cost C = {self.save_seconds:.3f} s, MTBF M = {self.mtbf_seconds:.1f} s, "
            f"step = {self.step_seconds * 1000:.1f} ms, restart R = {self.restart_seconds:.1f} s",
            f"optimum (Young/Daly sqrt(2CM)) = {self.optimum_seconds:.2f} s = every {self.optimum_steps} steps: "
            f"expected overhead {self.optimum_overhead:.1%}, lost work {self.optimum_lost_steps:.1f} steps/failure",
        ]
        if self.current_steps is not None:
            assert self.current_overhead is not None and self.current_lost_steps is not None
            out.append(
                f"this run: every {self.current_steps} steps ({self.current_seconds:.2f} s): "
                f"expected overhead {self.current_overhead:.1%}, lost work {self.current_lost_steps:.1f} steps/failure"
            )
        return out


def advise(
    *,
    save_seconds: float,
    mtbf_seconds: float,
    step_seconds: float,
    current_every: int | None = None,
    restart_seconds: float = 0.0,
) -> IntervalAdvice:
    """The Young/Daly optimum for these measurements, and the run's own interval beside it."""
    c = _positive("save_seconds", save_seconds)
    m = _positive("mtbf_seconds", mtbf_seconds)
    s = _positive("step_seconds", step_seconds)
    r = _positive("restart_seconds", restart_seconds, allow_zero=True)
    if current_every is not None and (
        isinstance(current_every, bool) or not isinstance(current_every, int) or current_every < 1
    ):
        raise ConfigError("every", expected="an integer >= 1 (steps between checkpoints)", found=current_every)
    best = young_daly_seconds(c, m)
    best_steps = max(1, round(best / s))
    current_seconds = current_every * s if current_every is not None else None
    return IntervalAdvice(
        save_seconds=c,
        mtbf_seconds=m,
        step_seconds=s,
        restart_seconds=r,
        optimum_seconds=best,
        optimum_steps=best_steps,
        optimum_overhead=expected_overhead(best, c, m, r),
        optimum_lost_steps=expected_lost_seconds(best) / s,
        current_steps=current_every,
        current_seconds=current_seconds,
        current_overhead=expected_overhead(current_seconds, c, m, r) if current_seconds is not None else None,
        current_lost_steps=expected_lost_seconds(current_seconds) / s if current_seconds is not None else None,
    )


# -- checkpoint.every: "auto" -------------------------------------------------------------------

CHOICES_WINDOW = 32
"""How many of its latest interval choices a run carries (and its summary shows)."""


class AutoInterval(BaseModel):
    """How ``checkpoint.every: "auto"`` picks the interval, and the user's bounds on it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    start_every: Annotated[int, Field(ge=1)] = 10
    """Steps between checkpoints until a segment has measured a save and a step."""
    min_steps: Annotated[int, Field(ge=1)] = 1
    """Never fewer than this many steps between checkpoints."""
    max_steps: Annotated[int, Field(ge=1)] | None = None
    """Never more than this many steps between checkpoints (at least ``min_steps``); null: no bound in steps."""
    max_seconds: Annotated[float, Field(gt=0)] | None = 1800.0
    """Never more than this many seconds of training between checkpoints (the most a failure
    can cost), whatever the estimate says."""
    prior_mtbf_seconds: Annotated[float, Field(gt=0)] = 86400.0
    """The failure rate assumed before the run has observed any: one failure per this many
    seconds of training (a day)."""
    prior_weight: Annotated[float, Field(gt=0)] = 1.0
    """How many observed failures the prior is worth (a Gamma prior on the failure rate)."""
    smoothing: Annotated[float, Field(gt=0, le=1)] = 0.3
    """Weight of the newest segment in the moving averages of save and step time."""

    @model_validator(mode="after")
    def _max_at_least_min(self) -> AutoInterval:
        if self.max_steps is not None and self.max_steps < self.min_steps:
            raise ValueError(f"max_steps must be >= min_steps (found {self.max_steps} < {self.min_steps})")
        return self


Bound = Literal["unmeasured", "min_steps", "max_steps", "max_seconds"]


class IntervalChoice(BaseModel):
    """One choice of the interval, with what it was computed from."""

    model_config = ConfigDict(extra="forbid")

    step: int
    """The run's step when the choice was made (it holds from there)."""
    every: int
    save_seconds: float | None
    """Measured: the trainer's blocked time per checkpoint (moving average)."""
    step_seconds: float | None
    """Measured: training time per step, saves excluded (moving average)."""
    mtbf_seconds: float
    """Estimated: the prior and the failures observed over the training time observed."""
    failures: int
    exposure_seconds: float
    optimum_seconds: float | None
    """Daly's optimum for these figures; None while unmeasured."""
    bound: Bound | None = None
    """What held the interval back from the optimum, if anything."""

    def why(self) -> str:
        """One line for people."""
        if self.bound == "unmeasured" or self.optimum_seconds is None:
            return f"every {self.every} steps (not measured yet: auto.start_every)"
        assert self.save_seconds is not None and self.step_seconds is not None
        held = f", held at {self.bound}" if self.bound else ""
        return (
            f"every {self.every} steps: save C = {self.save_seconds * 1000:.1f} ms, MTBF M = {self.mtbf_seconds:.0f} s "
            f"({self.failures} failure(s) in {self.exposure_seconds:.0f} s + prior), optimum sqrt(2CM) - C = "
            f"{self.optimum_seconds:.2f} s at {self.step_seconds * 1000:.2f} ms/step{held}"
        )


class IntervalState(BaseModel):
    """What a run has measured for ``every: "auto"``: bounded, carried across continue-as-new."""

    model_config = ConfigDict(extra="forbid")

    saves: int = 0
    save_seconds: float | None = None
    step_seconds: float | None = None
    failures: int = 0
    exposure_seconds: float = 0.0
    choices: list[IntervalChoice] = Field(default_factory=list)
    """The latest ``CHOICES_WINDOW`` choices, oldest first: only changes are appended."""

    @field_validator("choices")
    @classmethod
    def _bounded(cls, value: list[IntervalChoice]) -> list[IntervalChoice]:
        return value[-CHOICES_WINDOW:]

    @property
    def every(self) -> int | None:
        return self.choices[-1].every if self.choices else None

    def observe(
        self,
        spec: AutoInterval,
        *,
        saves: int,
        blocked_seconds: float,
        steps: int,
        train_seconds: float,
        failures: int = 0,
    ) -> None:
        """Fold one segment's measurements in: its saves and the time they blocked training, its
        steps and their training time (saves excluded), and the failed attempts before it."""
        a = spec.smoothing
        if saves > 0 and blocked_seconds >= 0:
            per = blocked_seconds / saves
            self.save_seconds = per if self.save_seconds is None else (1 - a) * self.save_seconds + a * per
            self.saves += saves
        if steps > 0 and train_seconds > 0:
            per = train_seconds / steps
            self.step_seconds = per if self.step_seconds is None else (1 - a) * self.step_seconds + a * per
        self.exposure_seconds += max(0.0, train_seconds) + max(0.0, blocked_seconds)
        self.failures += max(0, failures)

    def choose(self, spec: AutoInterval, step: int) -> IntervalChoice:
        """The interval from here on (recorded when it changes)."""
        choice = choose_interval(self, spec, step)
        if self.every != choice.every:
            self.choices = [*self.choices, choice][-CHOICES_WINDOW:]
        return choice


def mtbf_estimate(failures: int, exposure_seconds: float, spec: AutoInterval) -> float:
    """The posterior mean time between failures under a Gamma prior on the rate worth
    ``prior_weight`` failures at ``prior_mtbf_seconds``: (prior time + time observed) /
    (prior failures + failures observed)."""
    return (spec.prior_weight * spec.prior_mtbf_seconds + exposure_seconds) / (spec.prior_weight + failures)


def choose_interval(state: IntervalState, spec: AutoInterval, step: int) -> IntervalChoice:
    """Daly's optimum for what ``state`` measured, in whole steps, within the user's bounds."""
    mtbf = mtbf_estimate(state.failures, state.exposure_seconds, spec)

    def choice(every: int, optimum: float | None, bound: Bound | None) -> IntervalChoice:
        return IntervalChoice(
            step=step,
            every=every,
            save_seconds=state.save_seconds,
            step_seconds=state.step_seconds,
            mtbf_seconds=mtbf,
            failures=state.failures,
            exposure_seconds=state.exposure_seconds,
            optimum_seconds=optimum,
            bound=bound,
        )

    if not state.save_seconds or not state.step_seconds:
        start = max(spec.start_every, spec.min_steps)
        start = min(start, spec.max_steps) if spec.max_steps is not None else start
        return choice(start, None, "unmeasured")
    optimum = daly_seconds(state.save_seconds, mtbf)
    every = max(1, round(optimum / state.step_seconds))
    bound: Bound | None = None
    if spec.max_seconds is not None and every * state.step_seconds > spec.max_seconds:
        every, bound = max(1, math.floor(spec.max_seconds / state.step_seconds)), "max_seconds"
    if spec.max_steps is not None and every > spec.max_steps:
        every, bound = spec.max_steps, "max_steps"
    if every < spec.min_steps:
        every, bound = spec.min_steps, "min_steps"
    return choice(every, optimum, bound)
