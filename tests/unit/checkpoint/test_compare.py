"""Comparing training states (``cairn.checkpoint.compare``): every lineage field but the parent."""

from __future__ import annotations

import pytest

from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import LocalStore

pytestmark = pytest.mark.usefixtures("no_signing_key")
"""The code under test signs and verifies only with the key a test configures itself."""


def test_compare_reports_each_lineage_field_but_not_parent(local_store: LocalStore, config: TrainConfig) -> None:
    state = TrainingSession.fresh("cmp", local_store, config).state
    other = state.copy()
    other.lineage = state.lineage.model_copy(update={"parent": "sha256:" + "1" * 64})
    assert compare_states(state, other) == []
    other.lineage = state.lineage.model_copy(
        update={"dataset_version": "edited", "final_test_exposures": 3, "parent": "sha256:" + "2" * 64}
    )
    fields = {d.field for d in compare_states(state, other)}
    assert fields == {"lineage.dataset_version", "lineage.final_test_exposures"}
