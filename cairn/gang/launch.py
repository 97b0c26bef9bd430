"""Starting and supervising a gang of rank processes the way the field does: ``torchrun``.

``Gang`` writes the job file, starts ``torch.distributed.run`` (guarded by ``cairn.gang.agent``; c10d rendezvous,
``--max-restarts=0``: a failed rank fails the gang; the retry belongs to Temporal) with
``cairn.gang.rank`` as the entry point, and supervises it: progress from the ranks'
files, a stop request as a file, and on any failure or cancellation the whole gang is stopped
— torchrun first (it terminates its workers), then SIGKILL, then every process still carrying
the gang's token is killed (``reap``). The agent dies with its parent and each rank with its
agent (``PR_SET_PDEATHSIG``), so a SIGKILLed worker leaves no rank behind either.

One node: ``--standalone`` (torchrun picks the port). Several nodes: every node's agent meets
at ``rendezvous`` (``HOST:PORT``, hosted by node 0: ``is_host``), so ``nnodes x nproc_per_node``
ranks form one process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.errors import GangFailedError, error_named
from cairn.gang.agent import PARENT_ENV
from cairn.gang.job import GangJob, RankResult
from cairn.gang.rank import ENDED_GLOB, alive_path

__all__ = ["GangSpec", "Gang", "free_endpoint", "free_port", "reap", "gang_processes"]


@dataclass(frozen=True)
class GangSpec:
    nproc_per_node: int
    nnodes: int = 1
    rendezvous: str | None = None
    """``HOST:PORT`` of node 0's rendezvous store; None on one node (standalone)."""
    rdzv_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    is_host: bool = True
    """This node hosts the rendezvous store (node 0)."""
    local_addr: str | None = None
    """The address other nodes reach this node at (``--advertise-addr``): what c10d publishes
    as the process group's master address when this node becomes rank 0."""


HANG_AFTER_S = 60.0
"""How long a rank may show no sign of life (``cairn.gang.rank.signs_of_life``) before its gang is
stopped as hung, when the caller names no limit (a run on Temporal uses its heartbeat timeout)."""
MIN_HANG_AFTER_S = 5.0
"""The shortest silence taken for a hang, whatever the caller asks: a rank's signs of life were
seen up to ~2 s apart on a 2-core machine running 12 ranks (its thread waits for the GIL and the
cores), and a false hang would fail every retry alike."""

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = (10000, 32768)
"""Where ``free_port`` looks when the kernel's ephemeral range cannot be read (Linux's default
range starts at 32768)."""
_handed_out: set[int] = set()


def _listen_port_range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range: ``[low, high)``."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LISTEN_PORTS
    high = min(ephemeral_low, 65536)
    low = max(1024, min(LISTEN_PORTS[0], high - 4096))
    return (low, high) if high - low >= 1024 else LISTEN_PORTS


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, for a server to be started on it.

    Chosen **below the kernel's ephemeral range** (``ip_local_port_range``): a port the kernel
    hands out for ``bind(0)`` is one it also gives the next outgoing connection, so a server
    started a moment later (Temporal's Web UI after its frontend opened its own connections, a
    rendezvous store after the ranks dialled out) could find it taken. Never the same port twice
    in one process."""
    import random

    low, high = _listen_port_range()
    bind_host = "" if host not in ("127.0.0.1", "localhost") else host
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((bind_host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a crowded range: the kernel's choice, as before
        s.bind((bind_host, 0))
        return int(s.getsockname()[1])


def free_endpoint(host: str = "127.0.0.1") -> str:
    """``HOST:PORT`` with a port free right now on this host, for node 0's rendezvous store."""
    return f"{host}:{free_port(host)}"


def gang_processes(token: str) -> list[int]:
    """Pids of live processes whose command line carries ``token`` (Linux ``/proc``)."""
    found: list[int] = []
    needle = token.encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in cmdline and ") Z " not in stat:  # zombies are dead already
            found.append(int(entry.name))
    return found


def reap(token: str) -> list[int]:
    """SIGKILL every process of the gang ``token`` still alive; returns their pids."""
    pids = gang_processes(token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


class Gang:
    """One node's share of a gang: its torchrun agent and that agent's ranks."""

    def __init__(self, spec: GangSpec, job: GangJob, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.token = f"cairn-gang-{uuid.uuid4().hex[:16]}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.job_path = workdir / "job.json"
        job.write(self.job_path)
        self.log_path = workdir / "torchrun.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped_before_training = False
        """``supervise`` stopped the gang on request before its ranks began training."""
        self._first_heard: float | None = None
        self._signs: dict[int, tuple[int, float]] = {}
        for stale in (*workdir.glob("alive-rank*"), *workdir.glob(ENDED_GLOB), workdir / "progress.json"):
            stale.unlink(missing_ok=True)  # a previous gang's, in a reused folder: never this one's

    def command(self) -> list[str]:
        spec = self.spec
        cmd = [
            sys.executable,
            "-m",
            "cairn.gang.agent",  # torchrun, dying with this process
            f"--nnodes={spec.nnodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--max-restarts=0",
            "--monitor-interval=0.1",
        ]
        if spec.rendezvous is None:
            cmd.append("--standalone")
        else:
            cmd += [
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={spec.rendezvous}",
                f"--rdzv-id={spec.rdzv_id}",
                f"--rdzv-conf=is_host={'true' if spec.is_host else 'false'},join_timeout=60",
            ]
            if spec.local_addr:
                cmd.append(f"--local-addr={spec.local_addr}")
        return [*cmd, "-m", "cairn.gang.rank", "--job", str(self.job_path), "--gang", self.token]

    def start(self) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the host's cores
        env["PYTHONUNBUFFERED"] = "1"
        env[PARENT_ENV] = str(os.getpid())
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C at the terminal, or a signal to the caller's process group
            # (systemd's stop), reaches the caller, which stops the gang by its protocol
            # (checkpoint first), not the agent and its ranks directly.
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def progress(self) -> dict[str, Any] | None:
        try:
            doc = json.loads((self.workdir / "progress.json").read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def request_stop(self) -> None:
        (self.workdir / "stop").touch()

    def stop(self, grace: float = 5.0) -> list[int]:
        """Stop the whole gang now: SIGTERM the agent (it terminates its ranks), SIGKILL it
        after ``grace``, then kill whatever still carries the token. Returns reaped pids."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return reap(self.token)

    def failure(self, code: int) -> Exception:
        """The gang's failure, typed: a rank's own error (a config or checkpoint refusal is not
        retried) before a peer's 'connection closed', else the exit code and the log's tail."""
        reports = []
        for path in sorted(self.workdir.glob("error-rank*.json")):
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        reports.sort(key=lambda r: (r.get("type") == "GangFailedError", r.get("rank", 0)))
        if reports:
            first = reports[0]
            return error_named(str(first.get("type")), f"rank {first.get('rank')}: {first.get('message')}")
        tail = ""
        with contextlib.suppress(OSError):
            tail = " ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-3:])[-300:]
        return GangFailedError(f"rank processes failed (torchrun exit {code}; a rank was killed or crashed): {tail}")

    def silent_rank(self, hang_after: float) -> str | None:
        """Why this node's gang is hung, or None: a rank whose sign of life (its file's
        modification time) has not changed for ``hang_after`` seconds of this process's monotonic
        clock (frozen by SIGSTOP, a stopped VM, or stuck holding the GIL), or a rank never heard
        from ``hang_after`` seconds after its first peer on this node was (they start together).
        A rank that has ended is never silent. File times are compared only with themselves, so
        a skewed or stepped wall clock (a network file system's) cannot fake a hang."""
        now = time.monotonic()
        heard = 0
        for rank in self._local_ranks():
            try:
                mtime = alive_path(self.workdir, rank).stat().st_mtime_ns
            except OSError:
                continue
            seen = self._signs.get(rank)
            if seen is None or seen[0] != mtime:
                self._signs[rank] = (mtime, now)
            elif now - seen[1] > hang_after:
                return f"rank {rank} has shown no sign of life for {now - seen[1]:.1f} s (frozen or hung)"
            heard += 1
        ended = len(list(self.workdir.glob(ENDED_GLOB)))
        if heard and heard + ended < self.spec.nproc_per_node:
            if self._first_heard is None:
                self._first_heard = now
            elif now - self._first_heard > hang_after:
                missing = self.spec.nproc_per_node - heard - ended
                return f"{missing} rank(s) of this node never showed a sign of life ({hang_after:g} s after the first)"
        return None

    def _local_ranks(self) -> list[int]:
        """The global ranks this node's ranks have announced (``alive-rank{R}`` files)."""
        ranks = []
        for path in self.workdir.glob("alive-rank*"):
            suffix = path.name.removeprefix("alive-rank")
            if suffix.isdigit() and suffix.isascii():
                ranks.append(int(suffix))
        return sorted(ranks)

    def supervise(
        self,
        *,
        on_progress: Callable[[dict[str, Any]], None],
        cancelled: Callable[[], bool],
        stop_grace: float = 30.0,
        poll: float = 0.1,
        hang_after: float | None = None,
        abandoned: Callable[[], bool] | None = None,
    ) -> RankResult:
        """Run the gang to its end. ``cancelled()`` turning true asks the ranks to checkpoint and
        stop (they agree at the next step); past ``stop_grace`` the gang is killed. A stop asked
        by ``abandoned()`` (None: by ``cancelled()``) before the ranks have begun training (no
        progress yet: they may be waiting in the rendezvous for a node that died) has nothing to
        checkpoint: the gang is stopped at once (``GangFailedError``, ``stopped_before_training``
        set). A rank silent for ``hang_after`` seconds (None: ``HANG_AFTER_S``; at least
        ``MIN_HANG_AFTER_S``) fails the gang at once (retryable), as a dead rank does, rather
        than leaving its peers blocked in a collective until the collective timeout. Whatever
        happens, no process of the gang survives this call."""
        assert self.proc is not None, "start() first"
        deadline: float | None = None
        self._first_heard, self._signs = None, {}
        limit = max(MIN_HANG_AFTER_S, HANG_AFTER_S if hang_after is None else hang_after)
        quick = abandoned or cancelled
        try:
            while True:
                code = self.proc.poll()
                doc = self.progress()
                if doc is not None:
                    on_progress(doc)
                if code is not None:
                    if code != 0 and deadline is None and doc is None and cancelled() and quick():
                        # The stop's own signal reached the gang first (a Ctrl-C goes to the whole
                        # process group): a stop before training, not the gang's failure.
                        self.stopped_before_training = True
                        raise GangFailedError("stopped on request before its ranks began training")
                    break
                if deadline is None and cancelled():
                    if doc is None and quick():  # starting, restoring or in rendezvous: nothing to save yet
                        self.stopped_before_training = True
                        raise GangFailedError("stopped on request before its ranks began training")
                    self.request_stop()
                    deadline = time.monotonic() + stop_grace
                if deadline is not None and time.monotonic() > deadline:
                    raise GangFailedError(f"the gang did not stop within {stop_grace:.0f} s of the request")
                hung = self.silent_rank(limit)
                if hung is not None:
                    raise GangFailedError(f"{hung}; the gang was stopped (limit {limit:g} s)")
                time.sleep(poll)
        finally:
            self.stop()
        if code != 0:
            raise self.failure(code)
        result: RankResult = RankResult.read(self.workdir / "result.json", "gang result")
        return result
