"""The tutorial's runner (``tests/integration/test_tutorial.py``) on the page itself, without
servers: it reads the steps the integration test runs, a shell carries ``cd`` and ``export`` from
one command to the next, and a broken command fails naming the command and its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.test_tutorial import (
    COMMANDS,
    ENV,
    FILES,
    KILL,
    PAGE,
    PYTHONPATH,
    VERSION,
    WORKDIR,
    Shell,
    StepFailed,
    Tutorial,
    interrupted_line,
    on_test_ports,
    reader_env,
    tutorial_steps,
)


def test_the_page_has_the_steps_the_integration_test_runs() -> None:
    steps = tutorial_steps(PAGE.read_text())
    assert [s.text for s in steps if not s.file] == COMMANDS
    files = {s.file: s.text for s in steps if s.file}
    assert list(files) == FILES
    assert files["mymodel.py"] == (REPO / "examples" / "tutorial_model.py").read_text().rstrip("\n")  # the snippet
    run = json.loads(files["mymodel-run.json"])
    assert run["config"] == json.loads(files["mymodel.json"])  # the run trains what section 2 trained
    assert run["total_epochs"] * 1500 // run["config"]["batch_size"] == 3000  # the steps the page compares at


def test_the_ctrl_c_line_the_page_shows_is_the_one_the_test_reads() -> None:
    """The page's example of what Ctrl-C prints has the form the test parses the real one by."""
    shown = interrupted_line(PAGE.read_text())
    assert shown is not None
    step, resume = shown
    assert step == 1234 and resume.startswith("cairn train --resume /home/you/cairn-tutorial/runs/mymodel/training/")


def test_the_test_ports_reach_every_dev_command() -> None:
    ports = {"temporal": 1, "ui": 2, "s3": 3, "service": 4}
    flags = "--temporal-port 1 --ui-port 2 --s3-port 3 --service-port 4"
    assert on_test_ports(ENV, ports) == f'eval "$(cairn dev env {flags})"'
    assert f"cairn dev status {flags} --json | python" in on_test_ports(KILL, ports)
    assert on_test_ports("cairn run status tutorial-run", ports) == "cairn run status tutorial-run"


@pytest.fixture
def tutorial(tmp_path: Path) -> Tutorial:
    (tmp_path / "home").mkdir()
    (tmp_path / "state").mkdir()
    return Tutorial(Shell(cwd=tmp_path / "home", env=reader_env(tmp_path / "stack"), state=tmp_path / "state"))


def test_the_shell_keeps_the_folder_and_exports_of_the_commands_before(tutorial: Tutorial) -> None:
    steps = {s.text: s for s in tutorial_steps(PAGE.read_text())}
    tutorial.run(steps[WORKDIR])
    tutorial.run(steps[PYTHONPATH])
    assert tutorial.shell.cwd.name == "cairn-tutorial"
    assert tutorial.shell.env["PYTHONPATH"] == str(tutorial.shell.cwd)
    assert tutorial.shell.run('test "$PWD" = "$PYTHONPATH"').returncode == 0


def test_a_broken_command_fails_naming_it_and_its_line(tutorial: Tutorial) -> None:
    """A copy of the page with its first command mistyped: the run stops there and says where."""
    page = PAGE.read_text().replace(VERSION, "cairn --verison", 1)
    line = page.splitlines().index("cairn --verison") + 1
    with pytest.raises(StepFailed) as failed:
        for step in tutorial_steps(page):
            tutorial.run(step)
    message = str(failed.value)
    assert message.startswith(f"docs/tutorial.md:{line}: command `cairn --verison`: exit status 2, expected 0")
    assert "cairn: error:" in message  # what the command printed comes with it
    assert not (tutorial.shell.cwd / "cairn-tutorial").exists()  # nothing after it ran


def test_a_check_that_fails_names_the_command(tutorial: Tutorial) -> None:
    step = tutorial_steps(PAGE.read_text())[0]

    def says_hello(result: object) -> None:
        raise AssertionError("its output lacks 'hello'")

    with pytest.raises(StepFailed, match=r"command `cairn --version`: its output lacks 'hello'\n--- exit status 0"):
        tutorial.run(step, says_hello)
