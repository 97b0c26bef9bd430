"""Idempotency keys for external effects."""

from __future__ import annotations

import os
import uuid

__all__ = ["effect_key", "DROP_KEY_ENV"]

DROP_KEY_ENV = "CAIRN_TEST_DROP_IDEMPOTENCY_KEY"


def effect_key(workflow_id: str, activity_id: str) -> str:
    """``{workflow_id}/{activity_id}``: the same for every attempt of the activity and across
    continue-as-new (activity ids are set explicitly by the workflow), so a retried effect is
    recognised by the service as the one it already performed.

    Test-only: with ``CAIRN_TEST_DROP_IDEMPOTENCY_KEY=1`` each call returns a fresh random key,
    to show that the exactly-once tests fail without keys.
    """
    if os.environ.get(DROP_KEY_ENV) == "1":
        return f"dropped-{uuid.uuid4().hex}"
    return f"{workflow_id}/{activity_id}"
