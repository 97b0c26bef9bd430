"""The `temporal` commands of "Web UI, temporal CLI and tctl" (``docs/how-to/web-ui-and-temporal-cli.md``)
work as printed: every command line of the page, run by a shell with the `temporal` binary this
environment installs, on runs of ``examples/run.json`` with the page's workflow id and task
queue, each checked for what the page says it does.

Where the test differs from a reader, and why — nowhere else:

- **Connection**: the session's dev server through ``TEMPORAL_ADDRESS``, in a namespace of the
  test's own through ``TEMPORAL_NAMESPACE`` (the variables the page names), so that the page's
  workflow id ``example-run`` and queue ``cairn-training`` meet no other test's run.
- **The run file** (``RUN_FILE``): the test's copy of ``examples/run.json``, its store in the
  test's folder (the page asks for an absolute one), every checkpoint kept (the rollback's target
  is there whenever the signal arrives), and paced, with 2 s heartbeats, so that each signal meets
  a running segment and the segment hears of it within a few steps.
- **The worker**: in this process, polling what `cairn worker` polls.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistoryEventFilterType

from cairn.checkpoint import latest_committed, list_checkpoints
from cairn.effects.journal import load_journal
from cairn.stores import LocalStore
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer
from tests.unit.workers.cli.test_readme_commands import readme_commands
from workers.client import connect
from workers.stack.servers import find_binary
from workers.worker import serving

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "how-to" / "web-ui-and-temporal-cli.md"
RUN = "example-run"
QUEUE = "cairn-training"

START = (
    "temporal workflow start --type TrainingRun --task-queue cairn-training --workflow-id example-run "
    "--input-file examples/run.json"
)
START_2S = (
    "temporal workflow start --type TrainingRun --task-queue cairn-training --task-timeout 2s --workflow-id "
    "example-run --input-file examples/run.json"
)
PROGRESS = "temporal workflow query --workflow-id example-run --type progress"
DESCRIBE = "temporal workflow describe --workflow-id example-run"
SHOW = "temporal workflow show --workflow-id example-run"
INFO = "temporal workflow query --workflow-id example-run --type info"
RESULT = "temporal workflow result --workflow-id example-run"
LIST = "temporal workflow list --query \"WorkflowType='TrainingRun'\""
PAUSE = "temporal workflow signal --workflow-id example-run --name pause"
RESUME = "temporal workflow signal --workflow-id example-run --name resume"
STOP = "temporal workflow signal --workflow-id example-run --name stop"
CHECKPOINT_NOW = "temporal workflow signal --workflow-id example-run --name checkpoint_now"
ROLLBACK = "temporal workflow signal --workflow-id example-run --name rollback --input 40"
CANCEL = "temporal workflow cancel --workflow-id example-run"
TERMINATE = 'temporal workflow terminate --workflow-id example-run --reason "stuck: see the worker log"'

COMMANDS = {
    START, START_2S, PROGRESS, DESCRIBE, SHOW, INFO, RESULT, LIST,
    PAUSE, RESUME, STOP, CHECKPOINT_NOW, ROLLBACK, CANCEL, TERMINATE,
}  # fmt: skip
"""The page's command lines, every one run here."""

SEGMENT = 50
"""``steps_per_segment`` of examples/run.json."""
RUN_FILE = {"throttle_seconds_per_step": 0.15, "heartbeat_timeout_seconds": 2, "retention": None}
"""What the test's copy of examples/run.json changes, besides its store (see the module)."""
CLOSE_EVENT = WorkflowHistoryEventFilterType.CLOSE_EVENT


@dataclass(frozen=True)
class Shell:
    """A reader's shell in ``cwd``: `temporal` from this environment first on ``PATH``."""

    cwd: Path
    env: dict[str, str]

    async def run(self, line: str, ok: bool = True) -> str:
        """``line`` as printed, by ``sh -c``; what it printed. ``ok``: it must exit 0."""
        proc = await asyncio.create_subprocess_shell(
            line, cwd=self.cwd, env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert not ok or proc.returncode == 0, f"`{line}` exited {proc.returncode}:\n{out.decode()}\n{err.decode()}"
        return out.decode() + err.decode()

    async def progress(self) -> dict[str, Any]:
        """The page's progress query, its answer decoded."""
        return printed_json(await self.run(PROGRESS), "QueryResult")

    async def until(self, what: str, done: Callable[[], Any], timeout: float = 45) -> Any:
        """``done()`` (awaited when it is a coroutine) once it is true; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = done()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
            await asyncio.sleep(0.1)


def printed_json(out: str, field: str) -> dict[str, Any]:
    """The JSON object `temporal` printed as ``field`` (``QueryResult``, ``Result``)."""
    found = re.search(rf"^\s*{field}\s+(\{{.*\}})\s*$", out, re.MULTILINE)
    assert found is not None, out
    value: dict[str, Any] = json.loads(found.group(1))
    return value


def committed(store: LocalStore) -> list[int]:
    return [ref.step for ref in list_checkpoints(store, RUN)]


def latest_step(store: LocalStore) -> int:
    ref = latest_committed(store, RUN)
    return -1 if ref is None else ref.step


async def test_the_temporal_cli_commands_work_as_printed(temporal_server: TemporalServer, tmp_path: Path) -> None:
    assert set(readme_commands(PAGE.read_text())) == COMMANDS  # a command added to the page is run here
    namespace = f"docs-{uuid.uuid4().hex[:8]}"
    temporal = find_binary("temporal")
    register = [temporal, "operator", "namespace", "create", "--namespace", namespace]
    created = await asyncio.create_subprocess_exec(*register, "--address", temporal_server.address)
    assert await created.wait() == 0
    body = json.loads((REPO / "examples" / "run.json").read_text())
    assert body["run_id"] == RUN and body["steps_per_segment"] == SEGMENT
    body.update(store=str(tmp_path / "store"), **RUN_FILE)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "run.json").write_text(json.dumps(body))
    store = LocalStore(tmp_path / "store")
    path = f"{Path(temporal).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "TEMPORAL_ADDRESS": temporal_server.address, "TEMPORAL_NAMESPACE": namespace}
    sh = Shell(tmp_path, env)
    assert (await sh.run("command -v temporal")).strip() == temporal
    client = await connect(temporal_server.address, namespace)
    async with serving(client, QUEUE):
        # The first run: inspected, interrupted by each signal, stopped.
        assert f"WorkflowId  {RUN}" in await sh.run(START_2S)
        await sh.until("a commit at step 10 or past", lambda: latest_step(store) >= 10)
        described = await sh.run(DESCRIBE)
        assert "Pending Activities: 1" in described and "train_segment" in described, described
        assert (await sh.progress())["step"] == 0  # the first segment has not ended
        await sh.run(CHECKPOINT_NOW)  # the segment commits at its step and the run carries on
        now = await sh.until("the segment cut short", lambda: _past(sh, 0))
        assert 10 <= now["step"] < SEGMENT and now["checkpoint"].endswith(f"/{now['step']:012d}"), now
        assert now["step"] in committed(store) and now["phase"] == "training", now

        await sh.until("a commit at step 40 or past", lambda: latest_step(store) >= 40)
        await sh.run(PAUSE)
        paused = await sh.until("paused", lambda: _phase(sh, "paused"))
        # Less than a segment past 40, so the page's `--input 40` meets a kept commit (a rollback
        # by more is tested in test_training_run.py).
        assert 40 <= paused["step"] < 40 + SEGMENT and paused["step"] in committed(store), paused
        info = printed_json(await sh.run(INFO), "QueryResult")
        assert info == {"registry": None, "run_id": RUN, "store": str(tmp_path / "store")}
        history = await sh.run(SHOW)
        assert history.count("WorkflowExecutionSignaled") == 2 and history.count("ActivityTaskCanceled") == 2
        assert "Pending Activities: 0" in await sh.run(DESCRIBE)  # paused: no segment runs
        await sh.run(ROLLBACK)  # applied once the run goes on
        await sh.run(RESUME)
        [decision] = await sh.until("the rollback journaled", lambda: _decisions(store))
        assert decision.detail["to_step"] == 40 and decision.detail["from_step"] == paused["step"], decision
        rolled = await sh.until("back at step 40", lambda: _at(sh, 40))
        assert rolled["phase"] == "training", rolled
        await sh.run(STOP)
        result = await sh.run(RESULT)  # waits for the summary
        summary = printed_json(result, "Result")
        assert "COMPLETED" in result and summary["stopped_early"] and 40 <= summary["steps"] < 200, result
        assert summary["checkpoint"].endswith(f"/{summary['steps']:012d}")
        assert await _status(sh, "COMPLETED")

        # The same workflow id again: the run goes on from its latest commit, and is cancelled.
        stopped = latest_step(store)
        await sh.run(START)
        await sh.until("a commit past the stop's", lambda: latest_step(store) > stopped)
        await sh.run(CANCEL)
        await sh.until("cancelled", lambda: _status(sh, "CANCELED"))
        history = await sh.run(SHOW)
        assert history.index("ActivityTaskCancelRequested") < history.index("WorkflowExecutionCanceled"), history

        # And again, terminated.
        cancelled = latest_step(store)
        await sh.run(START_2S)
        await sh.until("a commit past the cancel's", lambda: latest_step(store) > cancelled)
        await sh.run(TERMINATE)
        await sh.until("terminated", lambda: _terminated(sh))  # describe prints no status for it
        closing = client.get_workflow_handle(RUN).fetch_history_events(event_filter_type=CLOSE_EVENT)
        [closed] = [event async for event in closing]
        assert closed.workflow_execution_terminated_event_attributes.reason == "stuck: see the worker log", closed
    listed = [line.split()[:2] for line in (await sh.run(LIST)).splitlines()[1:]]
    assert listed == [["Terminated", RUN], ["Canceled", RUN], ["Completed", RUN]], listed


def _decisions(store: LocalStore) -> list[Any]:
    return [e for e in load_journal(store, RUN).entries if e.kind == "decision"]


async def _past(sh: Shell, step: int) -> dict[str, Any] | None:
    progress = await sh.progress()
    return progress if progress["step"] > step else None


async def _at(sh: Shell, step: int) -> dict[str, Any] | None:
    progress = await sh.progress()
    return progress if progress["step"] == step else None


async def _phase(sh: Shell, phase: str) -> dict[str, Any] | None:
    progress = await sh.progress()
    return progress if progress["phase"] == phase else None


async def _terminated(sh: Shell) -> bool:
    return "WorkflowExecutionTerminated" in await sh.run(SHOW)


async def _status(sh: Shell, status: str) -> bool:
    return re.search(rf"^\s*Status\s+{status}\s*$", await sh.run(DESCRIBE), re.MULTILINE) is not None
