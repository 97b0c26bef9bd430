"""The tutorial (``docs/tutorial.md``) as a reader follows it: every command line of its ``bash``
blocks run as printed, in order, each by ``bash -c`` in one working directory, and every block
titled ``NAME`` (``python title="mymodel.py"``) saved as the file ``NAME`` where the reader is,
before the commands that follow it. A command starts with the variables the commands before it
exported and in the folder they left (``export``, ``eval "$(cairn dev env)"`` and ``cd`` work as
in the reader's shell). The environment is this test session's, less what would point a command
elsewhere (``TEMPORAL_*``, ``AWS_*``, ``PYTHONPATH``, ...), with ``.venv/bin`` first on ``PATH`` and
``CAIRN_STATE_DIR`` in the test's folder.

Where the test differs from a reader, and why — nowhere else:

- **Ctrl-C** (``CTRL_C``): the test sends SIGINT to the command's process group, as a terminal
  does, once it has committed a checkpoint; then it runs the command the page says to copy, the
  one ``cairn train`` printed after ``resume with:``.
- **Ports** (``on_test_ports``): every ``cairn dev`` command gets free ports
  (``--temporal-port ... --service-port ...``), so the test never meets a stack this machine runs
  on the defaults; the Web UI address the page prints is checked on the test's UI port.
- **Waits a reader does by eye**: the kill (``KILL``) waits until the run has committed a
  checkpoint (a reader sees it in ``cairn run status``); the status after it waits until Temporal
  has declared the killed attempt lost (the page says: after the heartbeat timeout). These waits,
  and reading the worker's pid to see it gone, run ``cairn run status --json`` and
  ``cairn dev status --json``, which the page does not print.

``COMMANDS`` lists the page's commands in order; a page whose commands differ fails at once
(``test_the_tutorial_runs_as_printed``), so an edit cannot leave a command unrun or unchecked.
Every step and what it printed goes to ``transcript.txt`` (in ``$CAIRN_TEST_ARTIFACTS/test_tutorial/``,
else the test's folder): the outputs the page quotes come from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import REPO
from workers.stack.servers import free_port

PAGE = REPO / "docs" / "tutorial.md"
_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="([^"]+)"')
_SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.MULTILINE)

STEPS = 3000
RUN = "tutorial-run"
S3_CHECKPOINT = f"s3://cairn/runs/{RUN}/training/{STEPS:012d}"

VERSION = "cairn --version"
WORKDIR = "mkdir -p cairn-tutorial && cd cairn-tutorial"
PYTHONPATH = 'export PYTHONPATH="$PWD"'
CTRL_C = "cairn train --config mymodel.json --steps 3000 --store runs --run-id mymodel"
REFERENCE = "cairn train --config mymodel.json --steps 3000 --store reference --run-id mymodel"
COMPARE_LOCAL = (
    "cairn ckpt compare runs/mymodel/training/000000003000 reference/mymodel/training/000000003000 "
    "--config mymodel.json"
)
UP = "cairn dev up --config mymodel-run.json"
ENV = 'eval "$(cairn dev env)"'
START = "cairn run start mymodel-run.json"
STATUS = "cairn run status tutorial-run"
KILL = (
    'kill -KILL -- -"$(cairn dev status --json | python -c '
    '\'import json, sys; print(json.load(sys.stdin)["worker"]["pid"])\')"'
)
WATCH = "cairn run watch tutorial-run"
COMPARE_S3 = f"cairn ckpt compare {S3_CHECKPOINT} reference/mymodel/training/000000003000 --config mymodel.json"
DRILL = "cairn drill --config mymodel.json --kills 2 --targets worker-kill,temporal-restart --out drill-report"
REPORT = "cairn run report tutorial-run --out run-report"
EXPORT = f"cairn ckpt export {S3_CHECKPOINT} mymodel-weights --format safetensors --config mymodel.json"
USE = "python use_model.py"
DOWN = "cairn dev down"

COMMANDS = [
    VERSION, WORKDIR, PYTHONPATH, CTRL_C, REFERENCE, COMPARE_LOCAL, UP, ENV, START, STATUS, KILL, STATUS, UP,
    WATCH, COMPARE_S3, DRILL, REPORT, EXPORT, USE, DOWN,
]  # fmt: skip
"""The page's command lines, in order."""
FILES = ["mymodel.py", "mymodel.json", "mymodel-run.json", "use_model.py"]
"""The files the page has the reader save, in order."""


# -- the page -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One thing the reader does: run ``text`` (a command line), or save ``text`` as ``file``."""

    line: int
    """Where the page says it (1-based)."""
    text: str
    file: str | None = None

    def __str__(self) -> str:
        return f"{PAGE.relative_to(REPO)}:{self.line}: " + (
            f"saving {self.file}" if self.file else f"command `{self.text}`"
        )


def with_snippets(body: str, root: Path = REPO) -> str:
    """A block's text as the site shows it: each ``--8<-- "PATH"`` line replaced by the file at
    PATH (relative to ``root``, the snippets extension's ``base_path``)."""
    return _SNIPPET.sub(lambda m: (root / m.group(1)).read_text().rstrip("\n"), body)


def tutorial_steps(text: str) -> list[Step]:
    """The page's steps in order: each line of a ``bash`` block is a command (``\\`` continuations
    joined; blank and comment lines skipped), each block with ``title="NAME"`` a file to save."""
    steps: list[Step] = []
    for match in _FENCE.finditer(text):
        lang, attrs, body = match.groups()
        first = text.count("\n", 0, match.start(3)) + 1
        title = _TITLE.search(attrs)
        if title:
            steps.append(Step(first - 1, with_snippets(body), file=title.group(1)))
            continue
        if lang != "bash":
            continue
        lines = body.splitlines()
        i = 0
        while i < len(lines):
            start, command = i, lines[i].strip()
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            if command and not command.startswith("#"):
                steps.append(Step(first + start, command))
    return steps


# -- the reader's shell ---------------------------------------------------------------------------
class StepFailed(AssertionError):
    """A step of the page did not do what the page says: which one, and what it printed."""

    def __init__(self, step: Step, why: str, result: subprocess.CompletedProcess[str] | None = None) -> None:
        text = f"{step}: {why}"
        if result is not None:
            text += f"\n--- exit status {result.returncode}\n--- stdout\n{_tail(result.stdout)}\n--- stderr\n"
            text += _tail(result.stderr)
        super().__init__(text)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


_NOT_CARRIED = {"_", "SHLVL", "OLDPWD"}


@dataclass
class Shell:
    """Command lines run as in one shell: each by ``bash -c``, starting in the folder and with the
    exported variables the one before left."""

    cwd: Path
    env: dict[str, str]
    state: Path
    """A folder for what each command leaves (its folder, its environment)."""

    def script(self, command: str) -> str:
        cwd, env = shlex.quote(str(self.state / "cwd")), shlex.quote(str(self.state / "env"))
        return f'{command}\n__status=$?\npwd > {cwd}\nenv -0 > {env}\nexit "$__status"\n'

    def start(self, command: str) -> subprocess.Popen[str]:
        for name in ("cwd", "env"):
            (self.state / name).unlink(missing_ok=True)
        return subprocess.Popen(
            ["bash", "-c", self.script(command)],
            cwd=self.cwd,
            env=self.env,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )

    def settle(self) -> None:
        """Take over the folder and environment the last command left."""
        if (self.state / "cwd").exists():
            self.cwd = Path((self.state / "cwd").read_text().strip())
        if (self.state / "env").exists():
            pairs = (item.partition("=") for item in (self.state / "env").read_text().split("\0") if item)
            self.env = {k: v for k, _, v in pairs if k not in _NOT_CARRIED}

    def run(self, command: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        proc = self.start(command)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return subprocess.CompletedProcess(command, 124, out, err + f"\n(timed out after {timeout:.0f} s)")
        self.settle()
        return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def reader_env(state_dir: Path) -> dict[str, str]:
    """This session's environment as a reader's shell: nothing pointing at another stack, store
    or package folder; this venv's ``cairn`` and ``python`` first; the stack's state in the test's
    folder."""
    dropped = ("TEMPORAL_", "AWS_", "CAIRN_STATE_DIR", "XDG_STATE_HOME", "PYTHONPATH", "CAIRN_TRAINERS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CAIRN_STATE_DIR"] = str(state_dir)
    return env


# -- running the page -----------------------------------------------------------------------------
Check = Callable[[subprocess.CompletedProcess[str]], None]
T = TypeVar("T")


@dataclass
class Tutorial:
    """The page run step by step; a step that fails raises ``StepFailed`` naming it."""

    shell: Shell
    ports: dict[str, int] = field(default_factory=dict)
    timeouts: dict[str, float] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)
    """What earlier steps found out (the killed worker's pid, ...)."""
    transcript: list[str] = field(default_factory=list)
    """Every step and what its command printed, for the artifact ``transcript.txt``."""

    def save(self, step: Step) -> None:
        assert step.file is not None
        (self.shell.cwd / step.file).write_text(step.text + "\n")
        self.transcript.append(f"# {step}\n")

    def record(self, step: Step, result: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.transcript.append(
            f"# {step} ({seconds:.1f} s)\n$ {result.args}\n{result.stdout}{result.stderr}[exit {result.returncode}]\n"
        )

    def run(self, step: Step, check: Check | None = None, expect_status: int = 0) -> subprocess.CompletedProcess[str]:
        """Run the step's command (on the test's ports); its exit status and ``check`` must hold."""
        started = time.monotonic()
        result = self.shell.run(on_test_ports(step.text, self.ports), timeout=self.timeouts.get(step.text, 180))
        self.record(step, result, time.monotonic() - started)
        if result.returncode != expect_status:
            raise StepFailed(step, f"exit status {result.returncode}, expected {expect_status}", result)
        if check is not None:
            try:
                check(result)
            except AssertionError as exc:
                raise StepFailed(step, f"{exc}", result) from None
        return result


_INTERRUPTED = re.compile(r"^cairn: interrupted at step (\d+): checkpoint .* committed; resume with: (.+)$", re.M)
_DEV = re.compile(r"\bcairn dev (up|down|status|env)\b")


def on_test_ports(command: str, ports: dict[str, int]) -> str:
    """``command`` with the test's ports after every ``cairn dev`` subcommand (none: as it is)."""
    if not ports:
        return command
    flags = " ".join(f"--{name}-port {port}" for name, port in ports.items())
    return _DEV.sub(lambda m: f"{m.group(0)} {flags}", command)


def contains(*parts: str) -> Check:
    def check(result: subprocess.CompletedProcess[str]) -> None:
        for part in parts:
            assert part in result.stdout, f"its output lacks {part!r}"

    return check


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait(condition: Callable[[], T], timeout: float, what: str) -> T:
    """``condition()``'s first true value, asked every 0.2 s for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)
    return value


def interrupted_line(text: str) -> tuple[int, str] | None:
    """(the step, the resume command) of the line ``cairn train`` prints on Ctrl-C, in ``text``."""
    found = _INTERRUPTED.search(text)
    return None if found is None else (int(found.group(1)), found.group(2))


def interrupt_and_resume(tut: Tutorial, step: Step) -> None:
    """The reader's Ctrl-C once a checkpoint is committed, then the command ``cairn train`` printed."""
    started = time.monotonic()
    proc = tut.shell.start(step.text)
    err: list[str] = []
    committed = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if " committed (loss " in line:
                committed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not committed.wait(120):
            raise StepFailed(step, "no checkpoint committed within 120 s:\n" + "".join(err[-10:]))
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise StepFailed(step, "still running 120 s after Ctrl-C:\n" + "".join(err[-10:])) from None
    finally:
        _kill_group(proc)
    reader.join(10)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()  # its checkpoint reference: one line
    proc.stdout.close()
    proc.stderr.close()
    tut.shell.settle()
    result = subprocess.CompletedProcess(step.text, proc.returncode, out, "".join(err))
    tut.record(step, result, time.monotonic() - started)
    if proc.returncode != 130:
        raise StepFailed(step, "Ctrl-C: exit status is not 130", result)
    printed = interrupted_line(result.stderr)
    if printed is None:
        raise StepFailed(step, "Ctrl-C: no `resume with:` line", result)
    interrupted_at, resume = printed
    if not 0 < interrupted_at < STEPS:
        raise StepFailed(step, f"Ctrl-C: interrupted at step {interrupted_at}, not during the run", result)
    started = time.monotonic()
    resumed = tut.shell.run(resume, timeout=300)  # the page: "copy the command after `resume with:` and run it"
    tut.record(Step(step.line, resume), resumed, time.monotonic() - started)
    final = tut.shell.cwd / "runs" / "mymodel" / "training" / f"{STEPS:012d}"
    if resumed.returncode != 0 or _last_line(resumed.stdout) != str(final):
        raise StepFailed(step, f"the printed resume command `{resume}` did not end at {final}", resumed)
    tut.facts["interrupted_at"] = interrupted_at


def kill_the_worker(tut: Tutorial, step: Step) -> None:
    """The kill, once ``cairn run status`` shows a committed checkpoint; then the worker must be
    gone, the run still running, and the Web UI's link (on the test's port) must answer."""
    _wait(lambda: _training(tut, 60), 120, "the run training past a checkpoint at step 60")
    status = json.loads(tut.run(Step(step.line, "cairn dev status --json")).stdout)
    pid = int(status["worker"]["pid"])
    tut.run(step)
    _wait(lambda: not _alive(pid), 20, f"the worker (pid {pid}) gone")
    after = _run_status(tut)
    assert after.get("status") == "RUNNING", f"the run is not running after the kill: {after}"
    tut.facts["worker_pid"] = pid
    ui = f"http://127.0.0.1:{tut.ports['ui']}/namespaces/default/workflows/{RUN}"
    with urllib.request.urlopen(ui, timeout=10) as page:
        assert page.status == 200, ui


def _run_status(tut: Tutorial) -> dict[str, Any]:
    """``cairn run status RUN --json`` in the reader's shell (a wait of the test's, not a page step)."""
    result = tut.shell.run(f"cairn run status {RUN} --json", timeout=60)
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def _training(tut: Tutorial, past: int) -> int | None:
    """The run's step once it is running with a committed checkpoint at ``past`` or later."""
    status = _run_status(tut)
    assert status.get("status") == "RUNNING", f"the run is not running: {status}"
    checkpoint = status.get("checkpoint")
    if not checkpoint or int(checkpoint.rsplit("/", 1)[1]) < past:
        return None
    return int(status["step"])


def attempt_lost(tut: Tutorial) -> None:
    """Until Temporal has declared the killed attempt lost (the retry is attempt 2)."""
    _wait(lambda: _run_status(tut).get("segment", {}).get("attempt", 1) >= 2, 60, "the killed attempt declared lost")


# -- the test -------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.drill  # it runs a drill, and the whole page takes minutes
@pytest.mark.timeout(1200)
def test_the_tutorial_runs_as_printed(tmp_path: Path) -> None:
    steps = tutorial_steps(PAGE.read_text())
    assert [s.text for s in steps if not s.file] == COMMANDS, "the page's commands changed: update COMMANDS"
    assert [s.file for s in steps if s.file] == FILES
    (tmp_path / "home").mkdir()
    (tmp_path / "state").mkdir()
    shell = Shell(cwd=tmp_path / "home", env=reader_env(tmp_path / "stack"), state=tmp_path / "state")
    ports = {name: free_port() for name in ("temporal", "ui", "s3", "service")}
    tut = Tutorial(shell, ports, timeouts={REFERENCE: 300, UP: 300, WATCH: 600, DRILL: 600, REPORT: 300})
    final = f"mymodel/training/{STEPS:012d}"
    checks: dict[str, Check] = {
        VERSION: lambda r: _assert(re.match(r"cairn \d+\.\d+", r.stdout), "no version"),
        WORKDIR: lambda r: _assert(shell.cwd.name == "cairn-tutorial", f"in {shell.cwd}"),
        PYTHONPATH: lambda r: _assert(shell.env.get("PYTHONPATH") == str(shell.cwd), "PYTHONPATH not the folder"),
        REFERENCE: lambda r: _assert(_last_line(r.stdout) == str(shell.cwd / "reference" / final), "not at 3000"),
        COMPARE_LOCAL: contains("identical: every tensor, t, rng, cursor, trainer state, history, config and lineage"),
        ENV: lambda r: _assert(shell.env.get("TEMPORAL_ADDRESS") == f"127.0.0.1:{ports['temporal']}", "no address"),
        START: contains(f"started TrainingRun {RUN} on task queue 'cairn-training' (store s3://cairn/runs"),
        WATCH: lambda r: _summary(tut, r),
        COMPARE_S3: contains("identical: every tensor, t, rng, cursor, trainer state, history, config and lineage"),
        DRILL: lambda r: _drill(shell.cwd, r),
        REPORT: lambda r: _report(shell.cwd, r),
        EXPORT: lambda r: _export(shell.cwd, r),
        USE: lambda r: _assert(  # the exported weights score what the run's last evaluation did
            abs(float(r.stdout.rsplit(":", 1)[1]) - float(str(tut.facts["val_accuracy"]))) < 0.0006, "accuracy"
        ),
    }
    downed = False
    ups = 0
    try:
        for step in steps:
            if step.file:
                tut.save(step)
            elif step.text == CTRL_C:
                interrupt_and_resume(tut, step)
            elif step.text == KILL:
                kill_the_worker(tut, step)
            elif step.text == UP:
                ups += 1
                if ups == 1:
                    tut.run(step, lambda r: _stack_up(tut, r))
                else:
                    gone = f"worker       not running (pid {tut.facts['worker_pid']} is gone): restarted"
                    tut.run(step, contains(gone, "the stack was up but for: worker (restarted)"))
            elif step.text == STATUS and "worker_pid" in tut.facts:
                attempt_lost(tut)  # the page: "after the heartbeat timeout (10 s) ..."
                tut.run(step, contains(f"{RUN}: RUNNING", "attempt 2", "last failure: activity Heartbeat timeout"))
            elif step.text == STATUS:
                tut.run(step, contains(f"{RUN}: RUNNING"))
            elif step.text == DOWN:
                tut.run(step)
                downed = True
                stopped = tut.shell.run(on_test_ports("cairn dev status", ports))
                assert stopped.returncode == 1, stopped.stdout  # nothing runs any more
            else:
                tut.run(step, checks.get(step.text))
    finally:
        if not downed:  # whatever failed: stop the stack this test started
            shell.run(on_test_ports(DOWN, ports), timeout=120)
        artifacts = Path(os.environ.get("CAIRN_TEST_ARTIFACTS") or tmp_path) / "test_tutorial"
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "transcript.txt").write_text("\n".join(tut.transcript))


def _summary(tut: Tutorial, result: subprocess.CompletedProcess[str]) -> None:
    """The run's summary: complete, at the checkpoint the page compares, the killed segment retried."""
    contains(f"run {RUN}: {STEPS}/{STEPS} steps", f"checkpoint   {S3_CHECKPOINT}", "2 segment(s), 1 retried")(result)
    validation = re.search(r"^validation   loss [0-9.]+, accuracy ([0-9.]+)$", result.stdout, re.M)
    assert validation is not None, "no validation line"
    tut.facts["val_accuracy"] = validation.group(1)


def _assert(condition: object, why: str) -> None:
    assert condition, why


def _stack_up(tut: Tutorial, result: subprocess.CompletedProcess[str]) -> None:
    """The stack is up, its Web UI where the page says (on the test's port), and its worker follows
    ``--config``: it preloads ``mymodel`` and runs one torch segment at a time."""
    contains(f"Web UI http://127.0.0.1:{tut.ports['ui']}", "worker       started")(result)
    status = json.loads(tut.shell.run(on_test_ports("cairn dev status --json", tut.ports)).stdout)
    argv = Path(f"/proc/{status['worker']['pid']}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert b" ".join(argv).endswith(b"--max-activities 1 --preload mymodel"), argv


def _drill(here: Path, result: subprocess.CompletedProcess[str]) -> None:
    contains("PASS  state        BIT-IDENTICAL", "VERDICT: PASS")(result)
    assert (here / "drill-report" / "report.txt").is_file(), "no drill-report/report.txt"


def _report(here: Path, result: subprocess.CompletedProcess[str]) -> None:
    contains("1 failure(s)", "activity Heartbeat timeout")(result)  # the kill, as the page reads it
    assert (here / "run-report" / "summary.txt").is_file(), "no run-report/summary.txt"
    assert sorted(p.name for p in (here / "run-report").glob("*.png")), "no plots in run-report/"


def _export(here: Path, result: subprocess.CompletedProcess[str]) -> None:
    """Weights only, and ``safetensors`` reads them under the model's ``state_dict()`` names."""
    from safetensors.numpy import load_file

    contains("WEIGHTS ONLY", "4 tensors")(result)
    weights = load_file(str(here / "mymodel-weights" / "weights-only.safetensors"))
    assert sorted(weights) == ["0.bias", "0.weight", "2.bias", "2.weight"], sorted(weights)
