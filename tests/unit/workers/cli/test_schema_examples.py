"""Every shipped example validates against the schema ``cairn schema`` prints for it: a trainer
config against ``schema config --trainer FACTORY`` (its own trainer's options, when it names
one), a run file against ``schema run-input --trainer FACTORY`` — so an editor using those
schemas never flags a file we ship, and flags a wrong trainer option in either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from workers.cli.schema import schema

EXAMPLES = sorted((REPO / "examples").glob("*.json"))


def _kind_and_trainer(document: dict[str, Any]) -> tuple[str, str | None]:
    run_file = "run_id" in document
    config = document["config"] if run_file else document
    factory = (config.get("trainer") or {}).get("factory")
    return ("run-input" if run_file else "config"), factory


def _options(document: dict[str, Any]) -> dict[str, Any]:
    config = document["config"] if "run_id" in document else document
    options: dict[str, Any] = config["trainer"]["options"]
    return options


def test_every_example_is_a_config_or_a_run_file() -> None:
    assert len(EXAMPLES) >= 14
    kinds = [_kind_and_trainer(json.loads(p.read_text()))[0] for p in EXAMPLES]
    assert kinds.count("config") >= 7 and kinds.count("run-input") >= 6, kinds


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_shipped_example_validates_against_its_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    document = json.loads(path.read_text())
    kind, trainer = _kind_and_trainer(document)
    validator = jsonschema.Draft202012Validator(schema(kind, trainer))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == [], errors


@pytest.mark.parametrize(
    "name", ["lm.json", "lm-run.json", "hf-gpt2.json", "finetune-run.json"], ids=lambda n: n.removesuffix(".json")
)
def test_a_wrong_trainer_option_is_flagged_by_the_trainers_schema(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    document = json.loads((REPO / "examples" / name).read_text())
    kind, trainer = _kind_and_trainer(document)
    assert trainer is not None
    _options(document)["no_such_option"] = 1
    wrong = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema(kind, trainer)).iter_errors(document)
    )
    assert wrong is not None and "'no_such_option' was unexpected" in wrong.message, wrong
