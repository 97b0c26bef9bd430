"""What every benchmark shares: states of a given size, interleaved timing, peak RSS, the
machine's description, cache eviction, a SeaweedFS server and where results go.

Benchmarks write nothing into the checkout but their results (``bench/results/*.json|png``,
``BENCHMARKS.md``); their stores live in temporary directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cairn.numerics import pin_environment, process_profile_name  # noqa: E402

if "numpy" not in sys.modules:  # a bench run alone computes under the default profile too
    pin_environment(process_profile_name())

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cairn.checkpoint import CheckpointOptions  # noqa: E402
from cairn.config import TrainConfig  # noqa: E402
from cairn.data import load_dataset  # noqa: E402
from cairn.state import TrainState  # noqa: E402
from cairn.trainers.mlp.arithmetic import init_state  # noqa: E402

RESULTS = REPO / "bench" / "results"


def _fixed_mmap_threshold() -> None:
    """Large buffers come from mmap and go back to the OS when freed, as in a fresh process:
    glibc otherwise raises its mmap threshold after the first free of a large block and keeps
    later ones in the heap, which would hide page-fault costs and the RSS a call really adds."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB, fixed


_fixed_mmap_threshold()
UNSIGNED = CheckpointOptions()  # the benchmarks measure bytes, not HMAC
MiB = 1 << 20


def big_state(mib: int, *, features: int = 2048, classes: int = 8, seed: int = 0) -> TrainState:
    """A real TrainState (tanh MLP) whose theta + m + v total about ``mib`` MiB, with
    non-trivial moments, as after real training."""
    hidden = max(1, int(mib * MiB / 8 / 3 / (features + classes + 1)))
    cfg = TrainConfig.model_validate(
        {
            "seed": seed,
            "model": {"hidden": hidden},
            "data": {"n_examples": 64, "n_features": features, "n_classes": classes},
        }
    )
    state = init_state(cfg, load_dataset(cfg.data))
    rng = np.random.default_rng(seed)
    for name in state.params:
        state.m[name][...] = rng.standard_normal(state.m[name].shape) * 1e-3
        state.v[name][...] = np.abs(rng.standard_normal(state.v[name].shape)) * 1e-6
    return state


def state_arrays(state: TrainState) -> list[np.ndarray]:
    """theta, m, v in a fixed order (what the floor writes and reads)."""
    return [*state.params.values(), *state.m.values(), *state.v.values()]


def state_bytes(state: TrainState) -> int:
    return sum(a.nbytes for a in state_arrays(state))


def interleaved(
    cases: dict[str, Callable[[], object]],
    reps: int,
    before: Callable[[str], object] = lambda _name: None,
) -> dict[str, list[float]]:
    """Seconds of each case per rep, the cases interleaved rep by rep (and their order rotated
    every rep) so that drift and other load on the machine hit all of them alike. ``before``
    (untimed) runs before every timed call: cleanup, cache eviction."""
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            before(name)
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    return times


def stats(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
        "samples": samples,
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def peak_rss(interval: float = 0.002) -> Iterator[dict[str, int]]:
    """Peak resident memory above the level at entry, sampled from /proc every ``interval``
    seconds while the block runs (``out["peak_extra"]`` after the block)."""
    out = {"baseline": _rss_bytes(), "peak_extra": 0}
    stop = threading.Event()

    def sample() -> None:
        peak = out["baseline"]
        while not stop.is_set():
            peak = max(peak, _rss_bytes())
            stop.wait(interval)
        out["peak_extra"] = max(0, max(peak, _rss_bytes()) - out["baseline"])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


def measure_rss(fn: Callable[[], object]) -> int:
    """Peak extra RSS of one call of ``fn`` (its result is dropped after the call)."""
    import gc

    gc.collect()
    with peak_rss() as rss:
        result = fn()
    del result
    gc.collect()
    return rss["peak_extra"]


def drop_cache(root: Path) -> None:
    """Evict the files' pages so that reads hit the device (pages are clean after fsync)."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    versions: dict[str, str] = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "safetensors", "blake3", "temporalio", "boto3"):
        with contextlib.suppress(Exception):
            versions[mod] = str(getattr(__import__(mod), "__version__", "?"))
    tmp = tempfile.gettempdir()
    disk = "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        best = ""
        for line in f:
            dev, mount, fstype = line.split()[:3]
            if tmp.startswith(mount) and len(mount) > len(best):
                best, disk = mount, f"{dev} ({fstype}) mounted at {mount}"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "kernel": platform.release(),
        "disk": disk,
        "loadavg_at_start": os.getloadavg(),
        "versions": versions,
    }


@contextlib.contextmanager
def seaweedfs(workdir: Path) -> Iterator[str]:
    """A SeaweedFS server (S3 on loopback) started as the tests do; yields its endpoint."""
    from workers.stack.servers import ServerProcess, free_port, seaweedfs_command, wait_for_http

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    (workdir / "weed").mkdir(parents=True, exist_ok=True)
    server = ServerProcess("seaweedfs", seaweedfs_command(workdir / "weed", port), workdir / "weed.log").start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for_http(endpoint + "/", timeout=60, alive=server.alive)
        yield endpoint
    finally:
        server.stop(grace=2.0)


def write_result(name: str, payload: dict[str, Any], *, quick: bool = False) -> Path:
    """``bench/results/NAME.json``; a quick (smoke) run writes to the temp dir instead, so it
    never replaces the results of a full run."""
    folder = Path(tempfile.gettempdir()) / "cairn-bench-quick" if quick else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    payload = {"benchmark": name, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **payload}
    path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    print(f"wrote {path}")
    return path


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds if seconds > 0 else float("inf")


@contextlib.contextmanager
def temporal_server(workdir: Path) -> Iterator[str]:
    """A Temporal dev server (headless, SQLite file) started as the tests do; yields its address."""
    from workers.stack.servers import ServerProcess, free_port, temporal_command, wait_for_tcp

    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(
        "temporal", temporal_command(port, None, workdir / "temporal.db"), workdir / "temporal.log"
    ).start()
    try:
        wait_for_tcp("127.0.0.1", port, timeout=60, alive=server.alive)
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=5.0)


def worker_process(address: str, task_queue: str, log: Path) -> Any:
    """A ``cairn worker`` process (``workers.worker``) on ``task_queue``: a ``ServerProcess``."""
    from workers.stack.servers import ServerProcess

    argv = [sys.executable, "-m", "workers.worker", "--address", address, "--task-queue", task_queue]
    return ServerProcess("worker", argv, log, env={"CAIRN_METRICS_PORT": "0"}, cwd=REPO).start()


async def wait_worker_polling(client: Any, task_queue: str, timeout: float = 60) -> None:
    """Until a worker polls ``task_queue`` (so that a timed run does not include its start)."""
    import asyncio

    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for kind in (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,):
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind
                )
            )
            if resp.pollers:
                return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no worker polls {task_queue} after {timeout}s")


async def run_history(client: Any, workflow_id: str, first_run_id: str) -> list[list[Any]]:
    """The events of every run of a workflow, following continue-as-new from ``first_run_id``."""
    runs: list[list[Any]] = []
    run_id: str | None = first_run_id
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [e async for e in handle.fetch_history_events()]
        runs.append(events)
        last = events[-1]
        run_id = None
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


def state_at(base: Any, step: int, history: dict[str, Any]) -> Any:
    """``base`` (a ``TrainState``; its arrays shared, read-only) as a valid state at ``step``
    with ``step`` entries of each ``history`` array."""
    import dataclasses

    return dataclasses.replace(
        base,
        step=step,
        cursor=step * base.config.batch_size,
        history={k: v[:step].tolist() for k, v in history.items()},
    )
