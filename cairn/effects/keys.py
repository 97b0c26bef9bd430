"""Idempotency keys for external effects."""

from __future__ import annotations

__all__ = ["effect_key"]


def effect_key(workflow_id: str, activity_id: str) -> str:
    """``{workflow_id}/{activity_id}``: the same for every attempt of the activity and across
    continue-as-new (activity ids are set explicitly by the workflow), so a retried effect is
    recognised by the service as the one it already performed.
    """
    return f"{workflow_id}/{activity_id}"
