"""How the S3 store behaves under many writers: which failures earn another attempt, how long to
wait before it, and how many requests one process keeps in flight.

- Retried: throttling (``SlowDown``, 503, 429 and the other throttling codes), server faults
  (500, 502, 504, ``InternalError``, ``RequestTimeout``) and broken connections (refused, reset,
  timed out, cut mid-body). Anything else (a missing key, a failed condition, bad credentials)
  is an answer, not a fault, and is raised at once.
- Backoff: capped exponential with full jitter — the wait before retry ``n`` is uniform in
  ``[0, min(cap_s, base * 2**(n-1))]``, with ``throttle_base_s`` as the base after a throttling
  answer and ``base_s`` after any other fault (botocore's "standard" scales, 1 s and 50 ms).
- In flight: one bound per process (``process_limit``), shared by every ``S3Store`` in it; a
  request holds its slot while it is sent and its body read, never while it waits to retry.

``S3Store`` is the only user; botocore's own retries are off, so this one policy governs every
request (parts, ranged GETs and their bodies, commits, listings). Settings come from
``CAIRN_S3_MAX_ATTEMPTS``, ``CAIRN_S3_BACKOFF_CAP_S``, ``CAIRN_S3_MAX_INFLIGHT`` and
``CAIRN_S3_MAX_INFLIGHT_HOST`` (split over torchrun's ``LOCAL_WORLD_SIZE``): see the README.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
)

from cairn.errors import ConfigError

__all__ = ["Fault", "RetryPolicy", "InflightLimit", "classify", "call_with_retries", "process_limit"]

T = TypeVar("T")

THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"}
)
THROTTLING_STATUS = frozenset({429, 503})
TRANSIENT_STATUS = frozenset({500, 502, 504})
DEFAULT_MAX_INFLIGHT = 64


class Fault(Enum):
    """Why a failed request is worth another attempt."""

    THROTTLED = "throttled"
    TRANSIENT = "transient"


def classify(exc: BaseException) -> Fault | None:
    """The fault behind a botocore error, or None when retrying would get the same answer."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in THROTTLING_CODES or status in THROTTLING_STATUS:
            return Fault.THROTTLED
        if code in TRANSIENT_CODES or status in TRANSIENT_STATUS:
            return Fault.TRANSIENT
        return None
    # Refused, reset, timed out, closed early, cut mid-body (ResponseStreamingError), short body.
    if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError):
        return Fault.TRANSIENT
    return None


def _env_number(env: Mapping[str, str], name: str, default: float, *, low: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low:
        raise ConfigError(name, expected=f"a number >= {low:g}", found=raw)
    return value


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 9
    """Attempts per request, the first included (botocore's "standard" mode as Cairn configured
    it before: 8 retries)."""
    base_s: float = 0.05
    throttle_base_s: float = 1.0
    cap_s: float = 20.0
    """No single wait is longer, however many attempts failed."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError("s3 retry attempts", expected=">= 1", found=self.attempts)
        if not all(math.isfinite(v) and v >= 0 for v in (self.base_s, self.throttle_base_s, self.cap_s)):
            raise ConfigError("s3 backoff", expected="finite seconds >= 0", found=(self.base_s, self.cap_s))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """``CAIRN_S3_MAX_ATTEMPTS`` and ``CAIRN_S3_BACKOFF_CAP_S`` over the defaults."""
        env = os.environ if env is None else env
        attempts = _env_number(env, "CAIRN_S3_MAX_ATTEMPTS", cls.attempts, low=1)
        if attempts != int(attempts):
            raise ConfigError("CAIRN_S3_MAX_ATTEMPTS", expected="an integer >= 1", found=env["CAIRN_S3_MAX_ATTEMPTS"])
        return cls(attempts=int(attempts), cap_s=_env_number(env, "CAIRN_S3_BACKOFF_CAP_S", cls.cap_s, low=0))

    def ceiling(self, retry: int, fault: Fault) -> float:
        """The longest wait before retry number ``retry`` (1 = the first retry)."""
        base = self.throttle_base_s if fault is Fault.THROTTLED else self.base_s
        return min(self.cap_s, base * 2.0 ** min(retry - 1, 64))

    def delay(self, retry: int, fault: Fault, rand: Callable[[], float] = random.random) -> float:
        """Full jitter: uniform in ``[0, ceiling]``, so writers throttled together spread out."""
        return rand() * self.ceiling(retry, fault)


class InflightLimit:
    """At most ``limit`` requests in flight at once; ``peak`` is the most ever seen."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ConfigError("CAIRN_S3_MAX_INFLIGHT", expected=">= 1", found=limit)
        self.limit = limit
        self.peak = 0
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._busy = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self._slots:
            with self._lock:
                self._busy += 1
                self.peak = max(self.peak, self._busy)
            try:
                yield
            finally:
                with self._lock:
                    self._busy -= 1


def inflight_from_env(env: Mapping[str, str] | None = None) -> int:
    """The per-process bound: ``CAIRN_S3_MAX_INFLIGHT`` (default 64), lowered to this process's
    share of ``CAIRN_S3_MAX_INFLIGHT_HOST`` when set (the host's budget over
    ``LOCAL_WORLD_SIZE``, the ranks torchrun starts on this host; 1 outside torchrun)."""
    env = os.environ if env is None else env
    limit = int(_env_number(env, "CAIRN_S3_MAX_INFLIGHT", DEFAULT_MAX_INFLIGHT, low=1))
    if env.get("CAIRN_S3_MAX_INFLIGHT_HOST", "").strip():
        host = int(_env_number(env, "CAIRN_S3_MAX_INFLIGHT_HOST", 0, low=1))
        local = int(_env_number(env, "LOCAL_WORLD_SIZE", 1, low=1))
        limit = min(limit, max(1, host // local))
    return limit


_PROCESS: dict[int, InflightLimit] = {}
_PROCESS_LOCK = threading.Lock()


def process_limit() -> InflightLimit:
    """This process's bound (made on first use, from the environment; a forked child gets its own)."""
    with _PROCESS_LOCK:
        pid = os.getpid()
        if pid not in _PROCESS:
            _PROCESS.clear()
            _PROCESS[pid] = InflightLimit(inflight_from_env())
        return _PROCESS[pid]


def call_with_retries(
    request: Callable[[], T],
    policy: RetryPolicy,
    limit: InflightLimit,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """``request()`` (one S3 request, its body read included) under ``limit``, retried on
    faults per ``policy``; the last failure, or any answer that is not a fault, is raised."""
    for attempt in range(1, policy.attempts + 1):
        try:
            with limit.slot():
                return request()
        except (ClientError, BotoCoreError) as exc:
            fault = classify(exc)
            if fault is None or attempt == policy.attempts:
                raise
        sleep(policy.delay(attempt, fault, rand))
    raise AssertionError("unreachable")
