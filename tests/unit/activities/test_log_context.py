"""Worker log lines name the attempt the run counts: a segment re-offered after its attempt was
lost on a worker's own queue is Temporal's attempt 1 but the run's attempt 2."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.edge import activity_errors
from activities.log_context import ContextFilter, attempt_number, run_context
from cairn.errors import ConfigError


def _environment(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    return env


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.handler.addFilter(ContextFilter())
    caplog.set_level(logging.INFO)
    return caplog


def test_a_reoffered_segment_logs_the_runs_attempt(logs: pytest.LogCaptureFixture) -> None:
    def body() -> int:
        with run_context("r1", attempt=2):
            logging.getLogger("cairn.activity").info("segment starts")
            with pytest.raises(ApplicationError), activity_errors():
                raise ConfigError("model.width", expected=4, found=8)
            return attempt_number()

    assert _environment(attempt=1).run(body) == 2
    records = logs.records
    assert [r.attempt for r in records] == [2, 2]  # type: ignore[attr-defined]
    assert "attempt 2 failed" in records[-1].getMessage()


def test_without_a_run_attempt_temporals_is_logged(logs: pytest.LogCaptureFixture) -> None:
    def body() -> int:
        with run_context("r1"):
            logging.getLogger("cairn.activity").info("open")
            return attempt_number()

    assert _environment(attempt=3).run(body) == 3
    records = logs.records
    assert records[-1].attempt == 3  # type: ignore[attr-defined]
    assert records[-1].run_id == "r1"  # type: ignore[attr-defined]
