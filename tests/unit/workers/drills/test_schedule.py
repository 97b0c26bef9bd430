"""The drill's seeded schedule and the checks of its spec (``workers.drills.schedule``)."""

from __future__ import annotations

import pytest

from cairn import errors as E
from workers.drills.schedule import FAULT_TARGETS, DrillSpec, default_total_steps, drill_spec, plan_schedule


def test_same_seed_same_schedule() -> None:
    spec = DrillSpec(seed=42, kills=12, targets=list(FAULT_TARGETS))
    first, again = plan_schedule(spec), plan_schedule(DrillSpec(seed=42, kills=12, targets=list(FAULT_TARGETS)))
    assert [f.to_json() for f in first] == [f.to_json() for f in again]
    other = plan_schedule(DrillSpec(seed=43, kills=12, targets=list(FAULT_TARGETS)))
    assert [f.to_json() for f in other] != [f.to_json() for f in first]


def test_every_target_at_least_once_and_effect_crash_first_or_last() -> None:
    for seed in range(20):
        spec = DrillSpec(seed=seed, kills=len(FAULT_TARGETS), targets=list(FAULT_TARGETS))
        schedule = plan_schedule(spec)
        assert sorted(f.kind for f in schedule) == sorted(FAULT_TARGETS)
        assert [f.index for f in schedule] == list(range(1, len(schedule) + 1))
        effect = next(i for i, f in enumerate(schedule) if f.kind == "kill-after-effect")
        assert (effect, schedule[effect].param) in ((0, "reserve"), (len(schedule) - 1, "publish"))
        every = spec.checkpoint_every
        assert all(every < f.gap_steps <= 3 * every + 7 for f in schedule if f.kind != "kill-after-effect")
        assert default_total_steps(spec, schedule) > sum(f.gap_steps for f in schedule)


def test_one_effect_crash_per_drill() -> None:
    schedule = plan_schedule(DrillSpec(seed=1, kills=4, targets=["kill-after-effect"]))
    assert [f.kind for f in schedule].count("kill-after-effect") == 1
    assert len(schedule) == 4


def test_length_covers_the_steps_that_pass_during_brownouts_and_restarts() -> None:
    """Training goes on through a brown-out and a server restart: the run must be long enough
    for the faults after them (CI once saw a 2.4 s brown-out eat the tail, and the last fault
    never fired). The seed-3 storage drill of test_drill: every step a brown-out or a restart
    can let pass (at the step's pacing) is added to the gaps, phases and tail."""
    spec = DrillSpec(
        seed=3,
        kills=3,
        targets=["storage-brownout", "s3-restart", "service-restart"],
        step_seconds=0.01,
        checkpoint_every=5,
    )
    schedule = plan_schedule(spec)
    brownout = next(f for f in schedule if f.kind == "storage-brownout")
    restarts = [f for f in schedule if f.kind.endswith("-restart")]
    base = sum(f.gap_steps for f in schedule) + 2 * spec.checkpoint_every * (len(schedule) + 1) + 20
    during = round(float(brownout.param) / spec.step_seconds) + len(restarts) * round(2.0 / spec.step_seconds)
    assert default_total_steps(spec, schedule) >= base + during
    # Worker faults stop training until the retry: they add nothing.
    kills = DrillSpec(seed=3, kills=3, targets=["worker-kill"], step_seconds=0.01, checkpoint_every=5)
    plan = plan_schedule(kills)
    assert default_total_steps(kills, plan) == sum(f.gap_steps for f in plan) + 2 * 5 * 4 + 20


def test_duration_sets_the_runs_length() -> None:
    spec = DrillSpec(duration_seconds=30, step_seconds=0.02)
    assert default_total_steps(spec, plan_schedule(spec)) == 1500


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"kills": 0}, "kills"),
        ({"targets": ["worker-kill", "meteor"]}, "targets.1"),
        ({"workers": 9}, "workers"),
        ({"heartbeat_timeout_seconds": 0.5}, "heartbeat_timeout_seconds"),
        ({"kils": 3}, "kils"),
    ],
)
def test_bad_spec_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(E.ConfigError) as info:
        drill_spec(data)
    assert f"drill: {field}" in str(info.value) and "\n" not in str(info.value)
