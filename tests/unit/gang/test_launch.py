"""Launching a gang (``cairn.gang.launch``): the command is torchrun without restarts, reaping
kills every process that carries the gang's token, and a rank whose signs of life stop is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cairn.errors import GangFailedError
from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec, gang_processes, reap
from cairn.gang.rank import alive_path, ended_path, signs_of_life
from tests.conftest import dist_config


def test_gang_command_is_torchrun_without_restarts(tmp_path: Path) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    one = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "one").command()
    assert one[1:3] == ["-m", "cairn.gang.agent"] and "--standalone" in one and "--max-restarts=0" in one
    spec = GangSpec(
        nproc_per_node=2, nnodes=2, rendezvous="127.0.0.1:29500", rdzv_id="x", is_host=False, local_addr="10.0.0.7"
    )
    two = Gang(spec, job, tmp_path / "two").command()
    assert "--rdzv-backend=c10d" in two and "--rdzv-endpoint=127.0.0.1:29500" in two
    assert "--rdzv-conf=is_host=false,join_timeout=60" in two and "--local-addr=10.0.0.7" in two
    assert two[-4:-2] == ["--job", str(tmp_path / "two" / "job.json")]


def test_reap_kills_every_process_carrying_the_gang_token() -> None:
    token = f"cairn-gang-{uuid.uuid4().hex[:16]}"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token], start_new_session=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 10
        while len(gang_processes(token)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sorted(reap(token)) == sorted(p.pid for p in procs)
        for p in procs:
            assert p.wait(timeout=10) == -signal.SIGKILL
        assert gang_processes(token) == []
    finally:
        for p in procs:
            p.kill()


def test_free_port_is_below_the_ephemeral_range_free_and_never_handed_out_twice(tmp_path, monkeypatch):
    """A listening port from ``bind(0)`` is one the kernel also gives outgoing connections: the
    CI run where Temporal's Web UI found its port taken by the server's own connection."""
    import socket

    from cairn.gang import launch

    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(launch, "EPHEMERAL_RANGE_FILE", ranges)
    ports = [launch.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10000 <= p < 32768 for p in ports), ports
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

    ranges.write_text("20000\t60999\n")
    assert all(10000 <= launch.free_port() < 20000 for _ in range(20))
    ranges.write_text("11000\t60999\n")  # little room below 10000: the 4,096 ports under the range
    assert all(6904 <= launch.free_port() < 11000 for _ in range(20))
    ranges.write_text("not a range")
    assert launch._listen_port_range() == launch.LISTEN_PORTS


def test_free_port_skips_a_port_something_listens_on(monkeypatch):
    import socket

    from cairn.gang import launch

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(launch, "_listen_port_range", lambda: (taken, taken + 2))
        monkeypatch.setattr(launch, "_handed_out", set())
        assert launch.free_port() == taken + 1
        fallback = launch.free_endpoint()  # the range is spent: the kernel's choice, still free
        assert fallback.startswith("127.0.0.1:") and int(fallback.rsplit(":", 1)[1]) not in (taken, taken + 1)


def test_a_rank_silent_past_the_limit_is_named_and_an_ended_one_never_is(tmp_path: Path, monkeypatch) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    g = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    assert g.silent_rank(5.0) is None  # nothing heard yet: the ranks are starting
    for rank in (2, 3):
        alive_path(g.workdir, rank).touch()
        os.utime(alive_path(g.workdir, rank), ns=(10**9, 10**9))  # a wall clock far off: never compared
    assert g.silent_rank(5.0) is None  # first seen now
    clock[0] += 4.0
    os.utime(alive_path(g.workdir, 2), ns=(2 * 10**9, 2 * 10**9))  # rank 2 lives on, rank 3 does not
    assert g.silent_rank(5.0) is None
    clock[0] += 5.5
    os.utime(alive_path(g.workdir, 2), ns=(3 * 10**9, 3 * 10**9))
    assert g.silent_rank(5.0) == "rank 3 has shown no sign of life for 9.5 s (frozen or hung)"
    assert g.silent_rank(10.0) is None
    alive_path(g.workdir, 3).rename(ended_path(g.workdir, 3))  # it finished: its silence is no hang
    assert g.silent_rank(5.0) is None


def test_a_rank_never_heard_from_while_its_peer_is_fails_the_gang(tmp_path: Path, monkeypatch) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    g = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    alive_path(g.workdir, 0).touch()
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    assert g.silent_rank(5.0) is None  # the first sign of a peer starts the clock
    clock[0] += 4.0
    os.utime(alive_path(g.workdir, 0), ns=(5 * 10**9, 5 * 10**9))
    assert g.silent_rank(5.0) is None
    clock[0] += 2.0
    assert g.silent_rank(5.0) == "1 rank(s) of this node never showed a sign of life (5 s after the first)"


def test_a_previous_gangs_files_in_a_reused_folder_are_not_this_ones(tmp_path: Path) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    (tmp_path / "gang").mkdir()
    for name in ("alive-rank0", "ended-rank1", "progress.json"):
        (tmp_path / "gang" / name).write_text("{}")
    g = Gang(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    assert g.progress() is None and g.silent_rank(5.0) is None
    assert sorted(p.name for p in g.workdir.iterdir()) == ["job.json"]


def test_a_rank_shows_signs_of_life_until_it_ends(tmp_path: Path) -> None:
    ended = signs_of_life(tmp_path, 1, every=0.01)
    path = alive_path(tmp_path, 1)
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first = path.stat().st_mtime_ns
    while path.stat().st_mtime_ns == first:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ended()
    assert not path.exists() and ended_path(tmp_path, 1).exists()


def _agent(script: str) -> type[Gang]:
    """A gang whose agent is ``python -c script`` (its ranks never start)."""

    class _Agent(Gang):
        def command(self) -> list[str]:
            return [sys.executable, "-c", script, self.token]

    return _Agent


_Starting = _agent("import time; time.sleep(60)")
"""A gang whose agent never gets its ranks training (a rendezvous waiting for a dead node)."""


def test_a_stop_request_before_the_ranks_train_stops_the_gang_at_once(tmp_path: Path) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    g = _Starting(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    g.start()
    with pytest.raises(GangFailedError, match="stopped on request before its ranks began training"):
        g.supervise(on_progress=lambda doc: None, cancelled=lambda: True, stop_grace=60.0)
    assert g.stopped_before_training
    assert gang_processes(g.token) == []  # not left to run out a 60 s grace


def test_a_stop_that_is_not_abandonment_waits_for_the_ranks_to_checkpoint(tmp_path: Path) -> None:
    """A worker shutting down (``cancelled`` but not ``abandoned``) lets starting ranks reach
    their first step and checkpoint: the gang is not stopped before training."""
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    g = _Starting(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    g.start()
    with pytest.raises(GangFailedError, match="did not stop within 0 s"):
        g.supervise(on_progress=lambda doc: None, cancelled=lambda: True, abandoned=lambda: False, stop_grace=0.2)
    assert not g.stopped_before_training and (g.workdir / "stop").exists()


_Interrupted = _agent("import os, signal; os.kill(os.getpid(), signal.SIGINT)")
"""A gang whose agent died of the interrupt that asked for the stop (Ctrl-C reaches the whole
process group), before its ranks began training."""


def test_a_gang_ended_by_the_stops_own_signal_before_training_is_a_stop_not_a_failure(tmp_path: Path) -> None:
    job = GangJob(run_id="r", store=str(tmp_path), config=dist_config(), target_step=1, checkpoint_every=1)
    g = _Interrupted(GangSpec(nproc_per_node=2), job, tmp_path / "gang")
    g.start()
    deadline = time.monotonic() + 30
    while g.proc is not None and g.proc.poll() is None:  # it has died before the loop first looks
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(GangFailedError, match="stopped on request before its ranks began training"):
        g.supervise(on_progress=lambda doc: None, cancelled=lambda: True)
    assert g.stopped_before_training
