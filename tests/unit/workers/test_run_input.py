"""Loading a run file (``workers.run_input``): a relative store is resolved once, and the distributed
examples validate, naming a world size that divides the microbatches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.errors import ConfigError
from cairn.runs.ownership import resolve_store_url
from tests.conftest import REPO
from workers.run_input import load_run_input


def test_run_start_resolves_a_relative_store_once(tmp_path: Path) -> None:
    body = json.loads((REPO / "examples" / "run.json").read_text())
    body["store"] = "runs/here"
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(body))
    inp = load_run_input(str(run_file), cwd=tmp_path)
    assert inp.store == str((tmp_path / "runs" / "here").resolve())
    assert resolve_store_url("s3://b/p") == "s3://b/p"


def test_the_distributed_examples_validate_and_name_a_world_size_that_divides_the_microbatches() -> None:
    from cairn.config import load_config
    from tests.conftest import REPO
    from workers.run_input import load_run_input

    config = load_config(REPO / "examples" / "distributed.json")
    assert config.distributed is not None and config.distributed.microbatches == 8
    inp = load_run_input(str(REPO / "examples" / "distributed-run.json"))
    assert inp.gang and inp.world_size == 4 and inp.config == config
    resumed = load_run_input(str(REPO / "examples" / "distributed-run.json"), overrides={"world_size": 2})
    assert resumed.world_size == 2
    with pytest.raises(ConfigError, match="world_size must divide"):
        load_run_input(str(REPO / "examples" / "distributed-run.json"), overrides={"world_size": 3})
