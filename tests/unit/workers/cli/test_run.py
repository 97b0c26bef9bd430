"""``cairn run start``: the run file and the node list are checked before connecting to Temporal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.conftest import run


def test_run_start_checks_the_file_before_connecting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad run file is exit 2 with the field named, even with no Temporal server to talk to."""
    from workers.stack.servers import free_port

    body = json.loads((REPO / "examples" / "run.json").read_text())
    body["checkpoint"] = {"evry": 3}
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(body))
    code, _, err = run(capsys, "run", "start", str(bad), "--address", f"127.0.0.1:{free_port()}")
    assert code == 2 and "checkpoint.evry" in err and "did you mean 'every'" in err, err


@pytest.mark.parametrize(("nodes", "refused"), [("a,,b", True), ("a,a", True), ("", False)])
def test_run_start_refuses_empty_or_repeated_nodes_before_connecting(
    capsys: pytest.CaptureFixture[str], nodes: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty name in the list is refused (not silently dropped); ``--nodes ""`` clears the
    file's nodes (one node, any worker) and goes on to connect."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens: a refusal must come first
    run_file = str(REPO / "examples" / "distributed-run.json")
    code, _, err = run(capsys, "run", "start", run_file, "--world-size", "2", "--nodes", nodes)
    if refused:
        assert code == 2 and "ConfigError" in err and "nodes" in err, err
    else:
        assert code == 5 and "TemporalUnavailableError" in err, err  # the input passed its checks


def test_run_start_takes_a_yaml_run_file_and_overrides_checked_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run file as YAML, a ``--set`` of the wrong type refused naming the field, a good one
    passing every check (then Temporal is what is missing)."""
    import yaml

    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens: a refusal must come first
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(json.loads((REPO / "examples" / "run.json").read_text())))
    code, _, err = run(capsys, "run", "start", str(run_file), "--set", "checkpoint.every=often")
    assert code == 2 and "checkpoint.every" in err and '(found "often")' in err, err
    code, _, err = run(capsys, "run", "start", str(run_file), "--set", "total_steps=seven")
    assert code == 2 and "total_steps: Input should be a valid integer" in err, err
    code, _, err = run(capsys, "run", "start", str(run_file), "--set", "checkpoint.every=auto", "--set",
                       "config.optimizer.lr=0.001")  # fmt: skip
    assert code == 5 and "TemporalUnavailableError" in err, err  # the input passed its checks
