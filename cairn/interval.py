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

Pure arithmetic, no I/O: ``cairn plan-interval`` and the drill's report both call ``advise``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cairn.errors import ConfigError

__all__ = [
    "IntervalAdvice",
    "young_daly_seconds",
    "daly_seconds",
    "expected_overhead",
    "expected_lost_seconds",
    "advise",
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
