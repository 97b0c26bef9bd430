"""Inputs and results of the effect activities (``activities.effects``): the run's external
side effects, their receipts and the decisions journalled beside them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cairn.runs import store_url_problem

__all__ = ["Model", "EffectsSpec", "EffectInput", "EffectReceipt", "DecisionInput"]


class Model(BaseModel):
    """The base of every workflow and activity payload: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class EffectsSpec(Model):
    """External side effects of the run (reserve before, publish on success, release at end)."""

    service_url: str
    """Base URL of the reservation service (``cairn dev up`` starts one and sets ``CAIRN_RESERVATION_URL`` to it)."""
    resource: str = "FILTER-A"
    """The service's resource whose capacity the run reserves."""
    units: Annotated[int, Field(gt=0)] = 2
    """Units of ``resource`` reserved before training and released at the end."""
    registry: str | None = None
    """Store URL of the model registry that ``publish`` writes to (default: the run's store);
    absolute or ``s3://``, like ``store``."""
    timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 15.0
    """Start-to-close timeout of each effect activity: how soon a worker that died mid-effect
    is given up on and the effect retried (with the same key) elsewhere."""

    @field_validator("registry")
    @classmethod
    def _registry_is_absolute(cls, value: str | None) -> str | None:
        problem = None if value is None else store_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class EffectInput(Model):
    run_id: str
    store: str
    store_id: str | None = None
    effects: EffectsSpec
    checkpoint: str | None = None
    fingerprint: str | None = None
    reservation_id: str | None = None
    reason: str = "completed"


class EffectReceipt(Model):
    effect: str
    key: str
    receipt: str
    replayed: bool = False
    """The journal (or the service) already held this key's outcome: nothing was redone."""
    reconciled: bool = False
    """The outcome was unknown (a pending intent) and was learnt by asking the service."""


class DecisionInput(Model):
    run_id: str
    store: str
    store_id: str | None = None
    decision: str
    detail: dict[str, object] = Field(default_factory=dict)
