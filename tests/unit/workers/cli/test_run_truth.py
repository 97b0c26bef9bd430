"""What `cairn run status`, `watch` and `start` show is true (issue 22), without a server: a
fake Temporal client stands in for describe, queries, history and start."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.converter import DATA_CONVERTER
from activities.inputs import TrainingRunInput
from activities.views import RunProgress
from cairn.checkpoint.latest import latest_committed
from cairn.runs.ownership import claim_run
from cairn.session import TrainingSession, default_run_id
from cairn.stores import LocalStore
from cairn.stores.identity import store_identity
from cairn.trainers.loading import normalized_config
from tests.conftest import REPO, small_config
from workers.cli import run_status
from workers.cli.main import main
from workers.cli.run_status import WATCH_INTERRUPTED_EXIT, live_view, stopped_watching
from workers.run_input import load_run_input, sent_input

RUNNING, FAILED = WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.FAILED


def progress(step: int, loss: float | None, total: int = 200) -> RunProgress:
    return RunProgress(
        run_id="r", phase="training", step=step, total=total, loss=loss, checkpoint=None, attempts=[],
        recomputed_steps=0, continued_as_new=0,
    )  # fmt: skip


def described(
    status: WorkflowExecutionStatus, *beats: dict[str, Any], activity: str = "train_segment", attempt: int = 1
) -> Any:
    raw = DescribeWorkflowExecutionResponse()
    for beat in beats:
        pending = raw.pending_activities.add()
        pending.activity_type.name = activity
        pending.attempt = attempt
        pending.heartbeat_details.payloads.add().data = json.dumps(beat).encode()
    return SimpleNamespace(status=status, raw_description=raw, task_queue="q")


# -- watch and status: step and loss from one source -------------------------------------------------
def test_the_loss_shown_is_the_loss_of_the_step_shown() -> None:
    """The bug: the bar's step came from the running segment's heartbeat (147) and its loss from
    the workflow's progress query, which knows only the last finished segment (step 78)."""
    view = live_view(progress(78, 3.5315), described(RUNNING, {"step": 147, "loss": 0.25}))
    assert view is not None and (view.step, view.loss, view.source) == (147, 0.25, "heartbeat")
    # No segment running (between segments, or the heartbeat is older): the workflow's own pair.
    assert live_view(progress(78, 3.5), described(RUNNING)) == run_status.LiveView(78, 3.5, "workflow")
    assert live_view(progress(80, 3.5), described(RUNNING, {"step": 60, "loss": 9.0})).loss == 3.5  # type: ignore[union-attr]
    # A segment that just resumed has no loss of its own yet: the workflow's, only for that same step.
    assert live_view(progress(78, 3.5), described(RUNNING, {"step": 78, "loss": None})).loss == 3.5  # type: ignore[union-attr]
    assert live_view(progress(70, 3.5), described(RUNNING, {"step": 78, "loss": None})).loss is None  # type: ignore[union-attr]
    # A gang: every node heartbeats; the furthest one, with its own loss.
    gang = described(RUNNING, {"step": 40, "loss": 2.0}, {"step": 42, "loss": 1.5}, activity="train_gang_node")
    assert live_view(None, gang) == run_status.LiveView(42, 1.5, "heartbeat")
    # A closed run has no live segment: what the workflow recorded.
    assert live_view(progress(78, 3.5), described(FAILED, {"step": 147, "loss": 0.25})).step == 78  # type: ignore[union-attr]


class FakeHandle:
    def __init__(self, client: FakeClient, workflow_id: str) -> None:
        self.client, self.id = client, workflow_id

    async def describe(self) -> Any:
        return await self.client.describe(self.id)

    async def query(self, query: Any, **_: Any) -> Any:
        if self.client.progress is None:
            raise RPCError("no worker", RPCStatusCode.UNAVAILABLE, b"")
        return self.client.progress

    async def result(self) -> Any:
        raise WorkflowFailureError(cause=self.client.failure)

    async def fetch_history_events(self) -> AsyncIterator[HistoryEvent]:
        event = HistoryEvent()
        attrs = event.workflow_execution_started_event_attributes
        attrs.input.payloads.add().data = json.dumps(self.client.start_input).encode()
        yield event


class FakeClient:
    """Describe / query / result / history / start, as the commands use them."""

    def __init__(self, descs: list[Any], progress: RunProgress | None = None) -> None:
        self.descs, self.progress, self.calls = descs, progress, 0
        self.failure: BaseException = ApplicationError("boom", type="ConfigError")
        self.start_input: dict[str, Any] = {}
        self.started: list[Any] = []
        self.on_describe: Any = None
        self.owner_status: dict[str, Any] = {}
        self.namespace = "default"
        self.workflow_service = SimpleNamespace(describe_task_queue=self._task_queue)

    async def _task_queue(self, _: Any) -> Any:
        """A worker polling now when the run answers queries (it has progress), else none."""
        now = Timestamp(seconds=int(time.time()))
        return SimpleNamespace(pollers=[PollerInfo(last_access_time=now)] if self.progress is not None else [])

    async def describe(self, workflow_id: str) -> Any:
        if workflow_id in self.owner_status:
            found = self.owner_status[workflow_id]
            if found is None:
                raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
            return SimpleNamespace(status=found)
        self.calls += 1
        if self.on_describe is not None:
            self.on_describe(self.calls)
        return self.descs[min(self.calls, len(self.descs)) - 1]

    def get_workflow_handle_for(self, _fn: Any, workflow_id: str, **_: Any) -> FakeHandle:
        return FakeHandle(self, workflow_id)

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> FakeHandle:
        return FakeHandle(self, workflow_id)

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        self.started.append((args, kwargs))
        return SimpleNamespace(result_run_id="run-1")


@pytest.fixture
def connect_to(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(client: FakeClient) -> FakeClient:
        async def connect(*_: Any, **__: Any) -> FakeClient:
            return client

        monkeypatch.setattr("workers.cli.temporal.connect", connect)
        return client

    return use


def test_watch_shows_the_heartbeats_loss_and_ctrl_c_only_stops_watching(
    connect_to: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real SIGINT while watching: the note (not `cairn: error: CommandInterrupted`), the
    documented exit status, and the bar showed step 147 with step 147's loss."""
    client = connect_to(FakeClient([described(RUNNING, {"step": 147, "loss": 0.25})], progress(78, 3.5315)))
    client.on_describe = lambda n: signal.raise_signal(signal.SIGINT) if n == 4 else None
    before = signal.getsignal(signal.SIGINT)
    code = main(["run", "watch", "wf-1", "--interval", "0.01"])
    out, err = capsys.readouterr()
    assert code == WATCH_INTERRUPTED_EXIT == 130, err
    assert "stopped watching wf-1; the run keeps going on its workers" in err, err
    assert "cairn: error" not in err and "CommandInterrupted" not in err and "Traceback" not in err, err
    frames = [m.groups() for f in re.split(r"[\r\n]", err) if (m := re.search(r"(\d+)/200 .*loss=([-\d.]+)", f))]
    assert frames and all(frame == ("147", "0.2500") for frame in frames), frames
    assert "3.5315" not in err and out == ""
    assert "\r" not in err and err.count("wf-1: step 147/200 ") == 1, err  # stderr is no terminal: one line
    assert signal.getsignal(signal.SIGINT) is before  # the handler is back: nothing else was touched


def test_a_segment_without_a_heartbeat_yet_shows_no_step_not_none() -> None:
    lines = run_status._running_lines(described(RUNNING, {}), [], {})
    assert lines[0].startswith("  segment     attempt 1, step -"), lines
    assert "None" not in lines[0]


def test_watch_to_a_pipe_prints_a_line_per_change_not_a_bar() -> None:
    lines = run_status.ProgressLines("wf", every=10.0)
    fields = {"phase": "training", "loss": "0.5000", "val_acc": "-", "retried": 0}
    assert lines.line(10, 100, fields, now=0.0) == "wf: step 10/100 phase=training loss=0.5000 val_acc=- retried=0"
    assert lines.line(10, 100, fields, now=50.0) is None  # nothing moved
    assert lines.line(12, 100, fields, now=5.0) is None  # moved, but within 10 s of the last line
    assert lines.line(14, 100, fields, now=10.0) is not None  # moved, 10 s on
    assert lines.line(14, 100, {**fields, "retried": 1}, now=10.5) is not None  # a retry: at once
    assert lines.line(14, 100, {**fields, "retried": 1, "phase": "paused"}, now=10.6) is not None


def test_watch_counts_the_segment_on_its_second_attempt_as_retried(
    connect_to: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bug: while a killed segment's second attempt ran, ``watch`` said retried=0 (the workflow
    counts a retried segment only once it finished); the server's attempt says so at once."""
    first = described(RUNNING, {"step": 40, "loss": 1.0})
    second = described(RUNNING, {"step": 30, "loss": 1.2}, attempt=2)  # killed; resumed from step 30
    client = connect_to(FakeClient([first, second, second], progress(0, None)))
    client.on_describe = lambda n: signal.raise_signal(signal.SIGINT) if n == 3 else None
    assert main(["run", "watch", "wf-1", "--interval", "0.01"]) == 130
    err = capsys.readouterr().err
    assert "wf-1: step 40/200 phase=training loss=1.0000 val_acc=- retried=0" in err, err
    assert "wf-1: step 30/200 phase=training loss=1.2000 val_acc=- retried=1" in err, err


def test_a_segment_resent_as_a_new_activity_counts_its_own_attempt_from_its_heartbeat() -> None:
    """A segment moved off a warm worker's queue, or a gang retried whole, is a new activity
    (server attempt 1); its heartbeat carries the segment's own attempt."""
    resent = described(RUNNING, {"step": 30, "loss": 1.2, "attempt": 3})
    assert run_status._fields(progress(0, None), None, resent)["retried"] == 1
    assert run_status._running_lines(resent, [], {})[0].startswith("  segment     attempt 3, step 30")
    first = described(RUNNING, {"step": 30, "loss": 1.2, "attempt": 1})
    assert run_status._fields(progress(0, None), None, first)["retried"] == 0


def test_watch_ctrl_c_with_json_is_one_json_object(connect_to: Any, capsys: pytest.CaptureFixture[str]) -> None:
    client = connect_to(FakeClient([described(RUNNING, {"step": 5, "loss": 1.0})], progress(0, None)))
    client.on_describe = lambda n: signal.raise_signal(signal.SIGINT) if n == 2 else None
    assert main(["run", "watch", "wf-1", "--interval", "0.01", "--json"]) == 130
    out, err = capsys.readouterr()
    assert json.loads(out) == {"workflow_id": "wf-1", "watching": "stopped", "run": "keeps going"}
    assert "the run keeps going" in err and "cairn: error" not in err


def committed_store(tmp_path: Path, run_id: str) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    TrainingSession.fresh(run_id, store, small_config()).run(6, checkpoint_every=3)
    return store


@pytest.mark.parametrize("worker", [True, False], ids=["worker-polling", "no-worker"])
def test_status_of_a_failed_run_names_its_reason_and_its_latest_checkpoint(
    connect_to: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, worker: bool
) -> None:
    """The workflow records a checkpoint only when a segment finishes: a run that failed in its
    first segment said `(none committed yet)` while its error named committed checkpoints. Its
    store has them; its Temporal status came with no reason (`FAILED - starting, step 0/0`)."""
    store = committed_store(tmp_path, "r")
    latest = str(latest_committed(store, "r"))
    reason = f"training diverged at step 7: loss is not finite; last committed checkpoint: {latest}"
    client = connect_to(FakeClient([described(FAILED)], progress(0, None, total=0) if worker else None))
    client.failure = ApplicationError(reason, type="TrainingDivergedError")
    client.start_input = {"run_id": "r", "store": str(tmp_path / "store")}
    assert main(["run", "status", "wf-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"wf-1: FAILED - TrainingDivergedError: {reason}", lines
    assert lines[1] == f"  checkpoint  {latest} (latest committed)", lines
    assert "starting" not in "\n".join(lines) and "none committed" not in "\n".join(lines)
    assert main(["run", "status", "wf-1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "FAILED" and shown["error"] == f"TrainingDivergedError: {reason}"
    assert shown["checkpoint"] == latest and shown["checkpoint_from"] == "store"


def test_status_of_a_failed_run_whose_store_is_out_of_reach(
    connect_to: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client = connect_to(FakeClient([described(FAILED)]))
    client.start_input = {"run_id": "r", "store": "s3://no-such-bucket-cairn-test/x"}
    client.failure = ApplicationError("boom", type="ConfigError")
    run_status.STORE_TIMEOUT = 0.5  # restored below; an unreachable endpoint must not hold status
    try:
        assert main(["run", "status", "wf-1", "--endpoint-url", "http://127.0.0.1:9"]) == 0
    finally:
        run_status.STORE_TIMEOUT = 15.0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["wf-1: FAILED - ConfigError: boom", "  checkpoint  - (none committed)"], lines


# -- start: refuse an owned run id before anything starts ---------------------------------------------
def owned_run_file(tmp_path: Path, owner: str) -> Path:
    body = json.loads((REPO / "examples" / "run.json").read_text())
    body.update(run_id="owned", store=str(tmp_path / "store"), total_steps=10)
    store = LocalStore(tmp_path / "store")
    store_id = store_identity(store, create=True)
    assert store_id is not None
    claim_run(store, "owned", owner, store_id, owner_running=lambda _: False)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize(
    ("owner_status", "refused"),
    [(RUNNING, True), (WorkflowExecutionStatus.TERMINATED, False), (FAILED, False), (None, False)],
    ids=["running", "terminated", "failed", "unknown-to-temporal"],
)
def test_start_refuses_a_run_id_a_running_workflow_owns(
    connect_to: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, owner_status: Any, refused: bool
) -> None:
    client = connect_to(FakeClient([]))
    client.owner_status = {"wf-a": owner_status}
    path = owned_run_file(tmp_path, "wf-a")
    code = main(["run", "start", str(path), "--workflow-id", "wf-b"])
    out, err = capsys.readouterr()
    if refused:
        assert code == 2 and client.started == [] and out == "", (code, out, err)
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(
            "cairn: error: RunOwnershipError: run_id: run 'owned' is being trained by workflow 'wf-a'"
        )
    else:  # a closed or unknown owner: the new workflow takes the run over
        assert code == 0 and len(client.started) == 1 and "started TrainingRun wf-b" in out, (code, out, err)
    # Its own workflow id is never refused here (Temporal refuses a duplicate running id itself).
    client.started.clear()
    assert main(["run", "start", str(path), "--workflow-id", "wf-a"]) == 0 and len(client.started) == 1
    capsys.readouterr()


# -- start: the input sent is the user's -------------------------------------------------------------
@pytest.mark.parametrize("name", ["run.json", "digits-run.json", "distributed-run.json"])
def test_the_input_sent_is_the_users_fields_and_means_the_same_run(tmp_path: Path, name: str) -> None:
    body = json.loads((REPO / "examples" / name).read_text())
    body["store"] = "runs"  # relative: resolved here, once
    path = tmp_path / name
    path.write_text(json.dumps(body))
    inp = load_run_input(str(path), cwd=tmp_path, overrides={"total_steps": 12, "total_epochs": None})
    sent = sent_input(inp)
    expected = {**body, "store": str((tmp_path / "runs").resolve()), "total_steps": 12, "total_epochs": None}
    assert sent == json.loads(json.dumps(expected)), sent  # the file's own fields: no defaults added
    if name == "digits-run.json":  # a torch trainer: none of the built-in MLP's sections
        assert not {"model", "data", "optimizer"} & set(sent["config"])
    # What the workflow decodes (its data converter) is the input validated here, defaults and all,
    # so its behaviour, its run id and the config its checkpoints record do not change.
    payloads = DATA_CONVERTER.payload_converter.to_payloads([sent])
    [decoded] = DATA_CONVERTER.payload_converter.from_payloads(payloads, [TrainingRunInput])
    assert decoded == inp and decoded.model_dump(mode="json") == inp.model_dump(mode="json")
    full = TrainingRunInput.model_validate(inp.model_dump(mode="json"))
    assert normalized_config(decoded.config).canonical_json() == normalized_config(full.config).canonical_json()
    assert default_run_id(normalized_config(decoded.config)) == default_run_id(normalized_config(full.config))


def test_nested_defaults_are_not_sent_and_what_the_user_set_is_kept(tmp_path: Path) -> None:
    body = {
        "run_id": "r", "store": "s", "total_steps": 5,
        "config": {"optimizer": {"lr": 0.01}},  # one optimizer field; the rest are defaults
        "checkpoint": {"every": 10},  # set, equal to its default: the user said it, so it is sent
        "retention": None,
        "effects": {"service_url": "http://127.0.0.1:1", "registry": "reg"},
    }  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(body))
    sent = sent_input(load_run_input(str(path), cwd=tmp_path))
    assert sent["config"] == {"optimizer": {"lr": 0.01}} and sent["checkpoint"] == {"every": 10}
    assert sent["retention"] is None and "steps_per_segment" not in sent and "numerics" not in sent
    assert sent["effects"] == {"service_url": "http://127.0.0.1:1", "registry": str((tmp_path / "reg").resolve())}
    assert sent["store"] == str((tmp_path / "s").resolve())


def test_ctrl_c_of_watch_before_it_polls_is_a_note_not_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C that lands while ``watch`` is still connecting reaches the dispatch: the same note
    and exit code as one inside the polling loop, no error line."""
    import argparse

    from workers.cli.main import _dispatch

    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    args = argparse.Namespace(
        handler=interrupted, on_interrupt=stopped_watching, workflow_id="wf-1", json=False, numerics=None
    )
    assert _dispatch(args) == WATCH_INTERRUPTED_EXIT
    err = capsys.readouterr().err
    assert "stopped watching wf-1; the run keeps going" in err and "error" not in err
