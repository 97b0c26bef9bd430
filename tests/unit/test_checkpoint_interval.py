"""The Young/Daly checkpoint-interval arithmetic (``cairn.checkpoint_interval``)."""

from __future__ import annotations

import math
import random

import pytest

from cairn import errors as E
from cairn.checkpoint_interval import (
    CHOICES_WINDOW,
    AutoInterval,
    IntervalState,
    advise,
    daly_seconds,
    expected_lost_seconds,
    expected_overhead,
    young_daly_seconds,
)


def test_young_daly_optimum_is_sqrt_2cm() -> None:
    assert young_daly_seconds(2.0, 3600.0) == pytest.approx(120.0)  # sqrt(2 * 2 * 3600)
    assert daly_seconds(2.0, 3600.0) == pytest.approx(118.0)


def test_optimum_minimises_the_overhead() -> None:
    c, m, r = 0.5, 600.0, 3.0
    best = young_daly_seconds(c, m)
    at_best = expected_overhead(best, c, m, r)
    for factor in (0.25, 0.5, 0.9, 1.1, 2.0, 4.0):
        assert expected_overhead(best * factor, c, m, r) > at_best
    # At the optimum the two terms balance: C/T == T/(2M).
    assert c / best == pytest.approx(best / (2 * m))
    assert at_best == pytest.approx(2 * c / best + r / m)


def test_lost_work_is_half_an_interval() -> None:
    assert expected_lost_seconds(10.0) == 5.0


def test_advice_in_steps_next_to_the_runs_interval() -> None:
    advice = advise(save_seconds=0.02, mtbf_seconds=8.0, step_seconds=0.01, current_every=10, restart_seconds=2.0)
    assert advice.optimum_seconds == pytest.approx(math.sqrt(2 * 0.02 * 8.0))
    assert advice.optimum_steps == round(advice.optimum_seconds / 0.01)
    assert advice.current_seconds == pytest.approx(0.1)
    assert advice.current_lost_steps == pytest.approx(5.0)
    assert advice.current_overhead is not None and advice.current_overhead > advice.optimum_overhead
    text = "\n".join(advice.lines())
    assert "sqrt(2CM)" in text and "this run: every 10 steps" in text
    assert advice.to_json()["optimum_steps"] == advice.optimum_steps


def test_advice_without_a_current_interval() -> None:
    advice = advise(save_seconds=1.0, mtbf_seconds=50.0, step_seconds=5.0)
    assert advice.optimum_steps == 2 and advice.current_overhead is None
    assert len(advice.lines()) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"save_seconds": 0.0}, "save_seconds"),
        ({"mtbf_seconds": -1.0}, "mtbf_seconds"),
        ({"step_seconds": math.nan}, "step_seconds"),
        ({"restart_seconds": math.inf}, "restart_seconds"),
        ({"current_every": 0}, "every"),
    ],
)
def test_bad_measurements_name_the_field(kwargs: dict[str, float], field: str) -> None:
    base: dict[str, float] = {"save_seconds": 1.0, "mtbf_seconds": 10.0, "step_seconds": 0.1}
    with pytest.raises(E.ConfigError) as info:
        advise(**{**base, **kwargs})  # type: ignore[arg-type]
    assert info.value.field == field


# -- checkpoint.every: "auto" ------------------------------------------------------------------


def simulate(spec: AutoInterval, *, mtbf: float, save: float, step: float, segments: int, seed: int) -> IntervalState:
    """A run under a synthetic failure process: exponential times between failures (mean
    ``mtbf`` seconds of training), saves that block ``save`` seconds, steps of ``step`` seconds
    (both with 10% noise), 30-second segments; a segment a failure falls in is retried (its
    result says attempt 2). Each segment checkpoints at the interval ``choose`` gave it."""
    rng = random.Random(seed)
    state = IntervalState()
    clock, next_failure, at_step = 0.0, rng.expovariate(1 / mtbf), 0
    for _ in range(segments):
        every = state.choose(spec, at_step).every
        steps = max(1, round(30.0 / step))
        saves = steps // every + 1
        train = steps * step * rng.uniform(0.9, 1.1)
        blocked = saves * save * rng.uniform(0.9, 1.1)
        clock += train + blocked
        failed = 0
        while next_failure <= clock:
            failed += 1
            next_failure += rng.expovariate(1 / mtbf)
        state.observe(spec, saves=saves, blocked_seconds=blocked, steps=steps, train_seconds=train, failures=failed)
        at_step += steps
    return state


def test_auto_converges_to_young_daly_on_a_synthetic_failure_process() -> None:
    spec = AutoInterval(prior_mtbf_seconds=3600.0, max_seconds=None)
    mtbf, save, step = 600.0, 0.05, 0.01
    state = simulate(spec, mtbf=mtbf, save=save, step=step, segments=12_000, seed=7)
    want = daly_seconds(save, mtbf) / step  # 770 steps
    last = state.choose(spec, 0)
    assert last.bound is None and last.optimum_seconds is not None
    assert abs(last.every - want) / want < 0.05, (last.why(), want)
    assert abs(last.mtbf_seconds - mtbf) / mtbf < 0.05, last.why()
    assert state.failures > 500  # the estimate rests on what was observed, not on the prior
    # The same process seen for a short while: the estimate is still the prior's, far from it.
    early = simulate(spec, mtbf=mtbf, save=save, step=step, segments=20, seed=7).choose(spec, 0)
    assert early.every > 1.5 * want, early.why()


def test_auto_with_no_failures_rests_on_the_prior() -> None:
    spec = AutoInterval(prior_mtbf_seconds=3600.0, max_seconds=None)
    state = IntervalState()
    state.observe(spec, saves=4, blocked_seconds=0.4, steps=1000, train_seconds=10.0)
    choice = state.choose(spec, 1000)
    assert choice.mtbf_seconds == pytest.approx(3600.0 + 10.4)  # the prior + the time observed
    assert choice.every == round(daly_seconds(0.1, choice.mtbf_seconds) / 0.01)


@pytest.mark.parametrize(
    ("bounds", "bound"),
    [({"max_steps": 100}, "max_steps"), ({"max_seconds": 2.0}, "max_seconds"), ({"min_steps": 5000}, "min_steps")],
)
def test_auto_stays_within_the_users_bounds(bounds: dict[str, object], bound: str) -> None:
    spec = AutoInterval(prior_mtbf_seconds=3600.0, **{"max_seconds": None, **bounds})  # type: ignore[arg-type]
    state = simulate(spec, mtbf=600.0, save=0.05, step=0.01, segments=2000, seed=3)
    choice = state.choose(spec, 0)
    assert choice.bound == bound, choice.why()
    assert choice.optimum_seconds is not None and choice.step_seconds is not None
    for c in state.choices:
        assert spec.min_steps <= c.every <= (spec.max_steps or c.every)
        assert spec.max_seconds is None or c.step_seconds is None or c.every * c.step_seconds <= spec.max_seconds
    held = choice.every * choice.step_seconds
    assert held < choice.optimum_seconds if bound != "min_steps" else held > choice.optimum_seconds


def test_auto_records_changes_only_in_a_bounded_window() -> None:
    spec = AutoInterval(prior_mtbf_seconds=3600.0, smoothing=1.0)
    state = IntervalState()
    assert state.choose(spec, 0).every == 10 and state.choose(spec, 0).every == 10
    assert len(state.choices) == 1  # the same choice twice is recorded once
    for i in range(100):
        state.observe(spec, saves=1, blocked_seconds=0.01 * (i + 1), steps=100, train_seconds=1.0)
        state.choose(spec, i)
    assert len(state.choices) == CHOICES_WINDOW
    assert "sqrt(2CM)" in state.choices[-1].why() and "not measured" in IntervalState().choose(spec, 0).why()


def test_auto_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="max_steps must be >= min_steps"):
        AutoInterval(min_steps=10, max_steps=5)
    with pytest.raises(ValueError, match="smoothing"):
        AutoInterval(smoothing=0)
