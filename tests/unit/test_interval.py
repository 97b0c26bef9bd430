"""The Young/Daly checkpoint-interval arithmetic (``cairn.interval``)."""

from __future__ import annotations

import math

import pytest

from cairn import errors as E
from cairn.interval import advise, daly_seconds, expected_lost_seconds, expected_overhead, young_daly_seconds


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
