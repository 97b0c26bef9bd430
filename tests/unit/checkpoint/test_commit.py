"""Committing a checkpoint (``cairn.checkpoint.commit``): content the reader would refuse (non-finite,
unreadable, past the read bounds) is never written; whatever commits reads back to the same
fingerprint; several writers commit one manifest; the same idempotency key with other content
is a conflict."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, read_manifest, read_tensors, write_checkpoint
from cairn.checkpoint.options import Limits
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from tests.conftest import refused_within_bounds, small_config

pytestmark = pytest.mark.usefixtures("no_signing_key")
"""The code under test signs and verifies only with the key a test configures itself."""


INFERENCE = CheckpointKind.INFERENCE


@pytest.mark.parametrize(
    "change, field",
    [
        ({"meta": {"loss": math.nan}}, "meta.loss"),
        ({"config": {"optimizer": {"lr": math.inf}}}, "config.optimizer.lr"),
        ({"rng": {"state": [1.0, -math.inf]}}, "rng.state[1]"),
    ],
)
def test_non_finite_content_is_refused_before_anything_is_written(
    memory_store: MemoryStore, change: dict[str, Any], field: str
) -> None:
    content = CheckpointContent(kind=INFERENCE, run_id="nf", step=1, **change)
    with pytest.raises(E.InvariantError) as info:
        write_checkpoint(memory_store, content, {"w": np.ones(3)})
    assert info.value.field == field
    assert list(memory_store.list()) == []


@pytest.mark.parametrize(
    "meta",
    [{"big": 10**70}, {"s": "\ud800"}, {"deep": json.loads("[" * 70 + "]" * 70)}, {"o": object()}],
    ids=["70-digit-int", "lone-surrogate", "70-deep", "not-json"],
)
def test_content_the_reader_would_refuse_is_not_committed(memory_store: MemoryStore, meta: dict[str, Any]) -> None:
    content = CheckpointContent(kind=INFERENCE, run_id="rt", step=1, meta=meta)
    with pytest.raises(E.InvariantError):
        write_checkpoint(memory_store, content, {"w": np.ones(2)})
    assert list(memory_store.list()) == []


@pytest.mark.parametrize("kind", ["too-many-tensors", "too-many-dims", "too-many-bytes"])
def test_tensors_over_the_read_bounds_are_not_written(memory_store: MemoryStore, kind: str) -> None:
    ceiling = Limits()
    if kind == "too-many-tensors":
        tensors = {f"t{i}": np.zeros(1) for i in range(ceiling.max_tensors + 1)}
        error: type[E.CheckpointError] = E.SizeLimitError
    elif kind == "too-many-dims":
        tensors, error = {"t": np.zeros((1,) * 9)}, E.TensorSpecError
    else:  # a view of one element one element past the ceiling: refused from its size, never copied
        tensors, error = {"t": np.broadcast_to(np.zeros(1), (ceiling.max_total_bytes // 8 + 1,))}, E.SizeLimitError
    content = CheckpointContent(kind=INFERENCE, run_id="big", step=1)
    refused_within_bounds(lambda: write_checkpoint(memory_store, content, tensors), error)
    assert list(memory_store.list()) == []


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**70), 10**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "é", "\\", '"', "[{"])
)


JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


JSON_OBJECTS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_OBJECTS, st.none() | JSON_OBJECTS, st.none() | JSON_OBJECTS, st.integers(0, 10**6))
def test_a_commit_either_reads_back_to_the_same_fingerprint_or_never_happens(
    meta: dict[str, Any], rng: dict[str, Any] | None, config: dict[str, Any] | None, step: int
) -> None:
    store = MemoryStore()
    content = CheckpointContent(
        kind=INFERENCE, run_id="prop", step=step, cursor=step, meta=meta, rng=rng, config=config
    )
    try:
        committed = write_checkpoint(store, content, {"w": np.arange(3.0)})
    except E.InvariantError:
        assert list(store.list()) == []
        return
    manifest = read_manifest(store, committed.ref, expect_kind=INFERENCE)
    assert manifest.fingerprint == committed.manifest.fingerprint
    assert json.dumps(manifest.meta, sort_keys=True) == json.dumps(meta, sort_keys=True)
    assert json.dumps(manifest.rng, sort_keys=True) == json.dumps(rng, sort_keys=True)
    assert json.dumps(manifest.config, sort_keys=True) == json.dumps(config, sort_keys=True)


def test_several_writers_one_manifest() -> None:
    """Each rank writes its own shard files; one manifest lists them all; loads as one."""
    from cairn.checkpoint import commit_manifest, new_save_nonce, write_shards

    store = MemoryStore()
    content = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="ranks", step=1)
    per_rank = {r: {f"layer{r}/w": np.full((4, 3), r, dtype=np.float64)} for r in range(3)}
    nonce = new_save_nonce()
    written = [write_shards(store, content, per_rank[r], nonce=nonce, rank=r) for r in range(3)]
    result = commit_manifest(store, content, written, nonce=nonce)
    assert result.created and result.manifest.writer.ranks == 3
    assert sorted(s.rank for s in result.manifest.shards) == [0, 1, 2]
    loaded = read_tensors(store, result.ref, read_manifest(store, result.ref, expect_kind=None))
    assert {k: float(v[0, 0]) for k, v in loaded.items()} == {"layer0/w": 0.0, "layer1/w": 1.0, "layer2/w": 2.0}
    # Two ranks claiming the same tensor is refused before anything is committed.
    other = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="ranks", step=2)
    clash = [write_shards(store, other, per_rank[0], nonce="x", rank=r) for r in range(2)]
    try:
        commit_manifest(store, other, clash, nonce="x")
    except E.TensorSpecError:
        pass
    else:
        raise AssertionError("duplicate tensor across ranks was committed")
    assert not store.exists("ranks/inference/000000000002/manifest.json")


def test_conflicting_commit_is_detected(local_store: LocalStore, config: TrainConfig) -> None:
    """Same idempotency key, different content: CheckpointConflictError; identical: converges."""
    a = TrainingSession.fresh("same", local_store, config)
    first = a.run(3)
    again = TrainingSession.fresh("same", local_store, config).run(3)
    assert first is not None and again is not None
    assert first.created and not again.created
    assert again.manifest.fingerprint == first.manifest.fingerprint
    other = TrainingSession.fresh("same", local_store, small_config(optimizer={"lr": 0.5}))
    with pytest.raises(E.CheckpointConflictError) as info:
        other.run(3)
    assert info.value.expected == first.manifest.fingerprint
