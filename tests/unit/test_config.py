"""The run config (``cairn.config``): values that cannot make sense name their field, sizes that
cannot fit in memory are refused before allocating, an unknown field suggests the closest name
(in any model), distributed settings are checked, and the built-in MLP's sections do not ride
along with another trainer."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from cairn import errors as E
from cairn.config import config_error_from, load_config, parse_config
from cairn.errors import ConfigError
from tests.conftest import refused_within_bounds, small_config


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"optimizer": {"lr": math.inf}}, "optimizer.lr"),
        ({"optimizer": {"lr": 100.0}}, "optimizer.lr"),
        ({"optimizer": {"eps": 5.0}}, "optimizer.eps"),
        ({"optimizer": {"eps": math.inf}}, "optimizer.eps"),
        ({"optimizer": {"weight_decay": 1e6}}, "optimizer.weight_decay"),
        ({"optimizer": {"weight_decay": math.inf}}, "optimizer.weight_decay"),
        ({"optimizer": {"beta1": math.nan}}, "optimizer.beta1"),
        ({"data": {"noise": math.inf}}, "data.noise"),
        ({"model": {"init_scale": math.inf}}, "model.init_scale"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"data": {"seed": -1}}, "data.seed"),
    ],
)
def test_non_finite_or_absurd_values_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config(overrides, "cfg.json")
    assert info.value.field == field
    assert str(info.value).startswith(f"cfg.json: {field}: ")


def test_largest_seed_is_accepted() -> None:
    assert parse_config({"seed": 2**63 - 1, "data": {"seed": 0}}).seed == 2**63 - 1


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"model": {"hidden": 65536}, "data": {"n_features": 65536}}, "model too large"),
        (
            {"model": {"hidden": 1}, "data": {"n_examples": 10_000_000, "n_features": 65536}},
            "synthetic dataset too large",
        ),
        ({"batch_size": 1_000_000, "data": {"n_features": 4096}}, "batch too large"),
    ],
)
def test_sizes_that_cannot_fit_in_memory_are_refused_before_allocating(
    tmp_path: Path, overrides: dict[str, Any], needle: str
) -> None:
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(overrides))
    err = refused_within_bounds(lambda: load_config(path), E.ConfigError)
    assert needle in str(err) and "expected <= " in str(err) and "found " in str(err)


def test_a_model_at_the_bound_is_accepted() -> None:
    # 2048 x 65536 + 65536 x 2 + biases ~ 2**27: parsing allocates nothing.
    assert parse_config({"model": {"hidden": 2040}, "data": {"n_features": 65536, "n_classes": 2}})


def test_unknown_field_suggests_the_closest_name() -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config({"optimizer": {"wieght_decay": 0.1}}, "cfg.json")
    assert str(info.value) == (
        "cfg.json: optimizer.wieght_decay: Extra inputs are not permitted — did you mean 'weight_decay'? (found 0.1)"
    )
    assert info.value.field == "optimizer.wieght_decay"


def test_unknown_field_without_a_close_name_gets_no_guess() -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config({"zzzzzz": 1}, "cfg.json")
    assert "did you mean" not in str(info.value) and "zzzzzz" in str(info.value)


def test_run_input_typos_suggest_the_field_at_their_location() -> None:
    from activities.inputs import TrainingRunInput
    from tests.conftest import REPO

    base = json.loads((REPO / "examples" / "run.json").read_text())
    cases: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
        (lambda b: b["checkpoint"].update(evry=3), "checkpoint.evry", "every"),
        (lambda b: b.update(run_ide=b.pop("run_id")), "run_ide", "run_id"),  # reported instead of "run_id missing"
        (lambda b: b["config"]["optimizer"].update(beta=0.9), "config.optimizer.beta", "beta"),
    ]
    for mutate, loc, suggestion in cases:
        body = json.loads(json.dumps(base))
        mutate(body)
        with pytest.raises(ValidationError) as info:
            TrainingRunInput.model_validate(body)
        message = str(config_error_from(info.value, "run.json", TrainingRunInput))
        assert message.startswith(f"run.json: {loc}: Extra inputs are not permitted — did you mean '{suggestion}")
        assert "\n" not in message and "(found " in message


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    weight: float = 0.0


class _Holder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[_Item] = []
    by_key: dict[str, _Item] = {}
    maybe: _Item | None = None


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"items": [{}, {"nmae": "x"}]}, "items.1.nmae"),
        ({"by_key": {"k": {"nmae": "x"}}}, "by_key.k.nmae"),
        ({"maybe": {"nmae": "x"}}, "maybe.nmae"),
        ({"itmes": []}, "itmes"),
    ],
)
def test_suggestions_work_for_any_model(body: dict[str, Any], loc: str) -> None:
    with pytest.raises(ValidationError) as info:
        _Holder.model_validate(body)
    message = str(config_error_from(info.value, "in", _Holder))
    want = "items" if loc == "itmes" else "name"
    assert message.startswith(f"in: {loc}: Extra inputs are not permitted — did you mean '{want}'?"), message


@pytest.mark.parametrize(
    ("distributed", "batch", "message"),
    [
        ({"microbatches": 6}, 12, "power of two"),
        ({"microbatches": 8}, 12, "must divide batch_size"),
        ({"microbatches": 2, "block_bytes": 100}, 4, "multiple of 8"),
    ],
)
def test_bad_distributed_configs_fail_fast_naming_the_field(distributed: dict, batch: int, message: str) -> None:
    from cairn.config import parse_config

    body = small_config().model_dump(mode="json")
    body.update(batch_size=batch, distributed=distributed)
    with pytest.raises(ConfigError, match=message):
        parse_config(body)


def test_mlp_sections_are_refused_for_another_trainer() -> None:
    with pytest.raises(E.ConfigError, match="'optimizer' configures the built-in MLP"):
        parse_config({"trainer": {"factory": "examples.digits:DigitsCNN"}, "optimizer": {"lr": 0.5}})
