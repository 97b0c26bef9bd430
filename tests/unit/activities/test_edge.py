"""Activities heartbeat while their own thread is busy (a long restore, a save, a listing), so a
phase longer than the heartbeat timeout never makes every attempt time out and loop."""

from __future__ import annotations

import time
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.edge import Heartbeater


def test_heartbeats_flow_while_the_activity_thread_blocks() -> None:
    beats: list[Any] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0] if details else None)

    def long_restore() -> None:
        with Heartbeater(0.05, phase="restoring") as hb:
            time.sleep(1.0)  # the activity's thread is stuck in one long call
            hb.update(phase="saving")
            time.sleep(0.5)

    env.run(long_restore)
    phases = [b["phase"] for b in beats]
    assert phases.count("restoring") >= 10 and phases.count("saving") >= 5, phases
    count = len(beats)
    time.sleep(0.2)
    assert len(beats) == count  # the background thread stopped with the activity
