"""``cairn eval --split test`` on a run that holds no test split names the way this trainer holds
one out: a PyTorch trainer got the built-in MLP's ``set data.test_fraction``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.session import TrainingSession
from cairn.stores import LocalStore
from tests.conftest import digits_config, small_config
from workers.cli.main import main


@pytest.mark.parametrize("kind", ["torch", "mlp"])
def test_the_missing_split_hint_is_the_trainers_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    config = digits_config(test_fraction=0.0) if kind == "torch" else small_config()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.model_dump(mode="json", exclude_unset=True)))
    result = TrainingSession.fresh("r", LocalStore(tmp_path / "store"), config).run(2)
    assert result is not None
    code = main(["eval", str(result.ref), "--split", "test", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    if kind == "torch":
        assert "Setup.test" in err and "data.test_fraction" not in err, err
    else:
        assert "set data.test_fraction" in err, err
