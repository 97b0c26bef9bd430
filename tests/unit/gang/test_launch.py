"""Launching a gang (``cairn.gang.launch``): the command is torchrun without restarts, and reaping
kills every process that carries the gang's token."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cairn.gang.job import GangJob
from cairn.gang.launch import Gang, GangSpec, gang_processes, reap
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
