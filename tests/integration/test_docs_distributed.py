"""Training on several ranks works as the docs print it: the transcript of "On one machine"
(``docs/how-to/distributed.md``), and the 4-rank line of "Training in-process and checkpoints"
(``docs/how-to/train-and-checkpoints.md``).

Each command line runs as printed, in order, by ``bash -c`` in one working directory (the test's,
where ``examples/`` is the checkout's), with `cairn` from this environment first on ``PATH``; what
it prints to stdout is what the page shows, the page's working directory ``/home/you`` being the
test's and a ``...`` line standing for the lines the page leaves out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.test_readme_commands import readme_commands

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "how-to" / "distributed.md"
HOME = "/home/you"
"""The working directory of the page's transcript."""

GANG = "cairn train --config examples/distributed.json --store runs --run-id dp --steps 40 --world-size 4"
RESUME = "cairn train --resume runs/dp/training/000000000040 --store runs --steps 40 --world-size 2"
REFERENCE = "cairn train --config examples/distributed.json --store ref --run-id dp --steps 80"
COMPARE = "cairn ckpt compare runs/dp/training/000000000080 ref/dp/training/000000000080"
SHOW = "cairn ckpt show runs/dp/training/000000000040 | sed -n 2,7p"
TRANSCRIPT = [GANG, RESUME, REFERENCE, COMPARE, SHOW]
"""The commands of "On one machine", in order."""
FOUR_RANKS = "cairn train --config examples/distributed.json --steps 40 --store runs --world-size 4"
"""The line of docs/how-to/train-and-checkpoints.md that trains on 4 ranks."""


def transcript(page: str, heading: str) -> list[tuple[str, list[str]]]:
    """The first ``console`` block after ``heading``: each ``$ `` command (its comment dropped)
    with the lines shown after it."""
    section = page[page.index(heading) :]
    found = re.search(r"^```console\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert found is not None, heading
    steps: list[tuple[str, list[str]]] = []
    for line in found.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((re.sub(r"\s+#\s.*$", "", line[2:]).strip(), []))
        else:
            steps[-1][1].append(line)
    return steps


def shows(printed: str, shown: list[str]) -> bool:
    """Whether ``printed`` is the page's ``shown`` lines, a ``...`` line standing for any lines."""
    pattern = r"\n".join(r"(?:.*\n)*.*" if line == "..." else re.escape(line) for line in shown)
    return re.fullmatch(pattern, printed.rstrip("\n")) is not None


def bash(line: str, cwd: Path) -> str:
    """``line`` as printed, by ``bash -c`` in ``cwd``; its stdout (it must exit 0)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The reader's working directory: the checkout's ``examples/`` there."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


def test_the_world_size_transcript_runs_as_printed(home: Path) -> None:
    """4 ranks to step 40, 2 ranks on to 80, one process to 80: the same bits, as the page shows."""
    steps = transcript(PAGE.read_text(), "## On one machine")
    assert [command for command, _ in steps] == TRANSCRIPT
    for command, shown in steps:
        printed = bash(command, home)
        expected = [line.replace(HOME, str(home)) for line in shown]
        assert shows(printed, expected), f"`{command}` printed:\n{printed}\nthe page shows:\n" + "\n".join(expected)


def test_the_four_rank_line_trains_as_printed(home: Path) -> None:
    assert FOUR_RANKS in readme_commands((REPO / "docs" / "how-to" / "train-and-checkpoints.md").read_text())
    printed = bash(FOUR_RANKS, home).strip()
    assert re.fullmatch(rf"{re.escape(str(home))}/runs/[\w.-]+/training/000000000040", printed), printed
    assert "written by   4 rank(s)" in bash(f"cairn ckpt show {printed}", home)
