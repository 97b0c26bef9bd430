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
