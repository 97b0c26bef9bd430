"""A superseded attempt writes nothing (``activities.fence``), and an attempt knows when it is
superseded (``Heartbeater.superseded``): it went without a heartbeat past its heartbeat timeout
(its process was frozen), or the server said the attempt is gone."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import ActivityEnvironment

from activities.edge import STALL_MARGIN_S, Heartbeater
from activities.fence import AttemptSuperseded, FencedStore
from cairn.stores import MemoryStore


def test_writes_pass_while_current_and_are_refused_once_superseded() -> None:
    inner = MemoryStore("fence-test")
    why: list[str] = []
    store = FencedStore(inner, lambda: why[0] if why else None)
    assert store.put_if_absent("a/manifest", b"1")
    store.write_object("a/shard", [b"xy"])
    why.append("no heartbeat for 9.0 s")
    with pytest.raises(AttemptSuperseded, match="no heartbeat for 9.0 s: not writing b/manifest"):
        store.put_if_absent("b/manifest", b"2")
    with pytest.raises(AttemptSuperseded):
        store.write_object("b/shard", [b"zz"])
    assert not inner.exists("b/manifest") and not inner.exists("b/shard")
    assert store.exists("a/manifest") and store.size("a/shard") == 2  # reads pass
    assert sorted(i.key for i in store.list("a/")) == ["a/manifest", "a/shard"]
    assert store.url == inner.url and store.read_piece_bytes == inner.read_piece_bytes


def test_the_save_target_is_fenced_too() -> None:
    class Tier(MemoryStore):  # a store that sends saves elsewhere (as a full local tier does)
        def __init__(self, durable: MemoryStore) -> None:
            super().__init__("tier")
            self.durable = durable

        def save_target(self, run_id: str, nbytes: int) -> MemoryStore:
            return self.durable

    durable = MemoryStore("durable")
    store = FencedStore(Tier(durable), lambda: "gone")
    target = store.save_target("run", 10)
    assert isinstance(target, FencedStore) and target.inner is durable
    with pytest.raises(AttemptSuperseded):
        target.put_if_absent("run/manifest", b"x")
    plain = FencedStore(MemoryStore("plain"), lambda: None)
    assert plain.save_target("run", 10) is plain


def _env(heartbeat_timeout: float) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=heartbeat_timeout))
    return env


def test_a_stall_past_the_heartbeat_timeout_supersedes_the_attempt() -> None:
    """The heartbeat thread is held (as in a frozen process) past timeout + margin: the activity's
    own thread sees it at once, before any heartbeat goes out again."""
    env = _env(0.2)
    hold = threading.Event()
    seen: dict[str, Any] = {}

    def on_heartbeat(*_: Any) -> None:
        if hold.is_set():
            hold.clear()
            time.sleep(STALL_MARGIN_S + 0.6)  # nothing beats meanwhile

    env.on_heartbeat = on_heartbeat

    def attempt() -> None:
        with Heartbeater(0.05) as hb:
            time.sleep(0.3)
            seen["before"] = hb.superseded()
            hold.set()
            deadline = time.monotonic() + 5
            while hb.superseded() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            seen["after"] = hb.superseded()

    env.run(attempt)
    assert seen["before"] is None
    assert seen["after"] is not None and "past the heartbeat timeout" in seen["after"], seen


def test_a_busy_activity_thread_is_not_a_stall() -> None:
    """The activity's own thread may block far past the heartbeat timeout: the heartbeats go on."""
    env = _env(0.1)

    def attempt() -> str | None:
        with Heartbeater(0.02) as hb:
            time.sleep(STALL_MARGIN_S + 0.5)
            return hb.superseded()

    assert env.run(attempt) is None


def test_the_server_saying_the_attempt_is_gone_supersedes_it() -> None:
    env = _env(10)
    seen: dict[str, Any] = {}

    def attempt() -> None:
        with activity.shield_thread_cancel_exception(), Heartbeater(0.02) as hb:  # as train_segment
            hb.notice_cancellation()
            seen["before"] = hb.superseded()
            env.cancel(ActivityCancellationDetails(not_found=True))
            hb.notice_cancellation()
            seen["after"] = hb.superseded()

    with pytest.raises(Exception, match="Cancelled"):  # the shield re-raises the cancel on exit
        env.run(attempt)
    assert seen["before"] is None and seen["after"] == "the server no longer knows this attempt"


def test_a_cancel_on_request_does_not_supersede() -> None:
    env = _env(10)

    def attempt() -> None:
        with activity.shield_thread_cancel_exception(), Heartbeater(0.02) as hb:
            env.cancel()  # pause / stop / checkpoint-now: the attempt commits and reports
            hb.notice_cancellation()
            time.sleep(0.1)
            seen.append(hb.superseded())

    seen: list[str | None] = []
    with pytest.raises(Exception, match="Cancelled"):
        env.run(attempt)
    assert seen == [None]
