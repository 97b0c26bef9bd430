"""A worker whose effects carry a fresh random key each time instead of their idempotency key.

The control of the exactly-once tests: it shows their checks can fail (a crash after the
service committed then consumes capacity twice). A test-only switch, kept out of the product:
the tests start this module instead of ``workers.worker``.
"""

from __future__ import annotations

import sys
import uuid

import activities.effects
from workers.worker import exit_now, main


def _no_key(workflow_id: str, activity_id: str) -> str:
    return f"dropped-{uuid.uuid4().hex}"


activities.effects.effect_key = _no_key  # type: ignore[assignment]

if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
