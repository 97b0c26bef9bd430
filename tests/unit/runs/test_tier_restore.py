"""Where a segment resumes from with a node-local tier: the local copy when it verifies (the
durable latest, or a newer local commit), else the durable latest — never a mix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.latest import latest_committed
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.tier import NodeTier, TieredStore
from cairn.config import TrainConfig
from cairn.errors import CheckpointConflictError
from cairn.runs.tier_restore import RestoreSource, local_candidate, resume_tiered
from cairn.session import TrainingSession
from cairn.stores.identity import store_identity
from cairn.stores.local import LocalStore
from tests.conftest import small_config
from tests.unit.checkpoint.test_tier import HeldUploader

RUN = "restore"


def _resume(tiered: TieredStore, durable: LocalStore, config: TrainConfig) -> tuple[TrainingSession, RestoreSource]:
    return resume_tiered(RUN, tiered, durable, config, options=CheckpointOptions.from_env())


def _tier(tmp_path: Path, durable: LocalStore, name: str = "tier") -> tuple[NodeTier, TieredStore, HeldUploader]:
    uploader = HeldUploader()
    node = NodeTier(tmp_path / name, 1 << 30, uploader)
    return node, node.tiered(durable.url, durable), uploader


def _trained(tmp_path: Path) -> tuple[LocalStore, NodeTier, TieredStore, TrainingSession]:
    """Steps 5 and 10 durable, 15 committed locally only (its upload pending)."""
    durable = LocalStore(tmp_path / "durable")
    node, tiered, uploader = _tier(tmp_path, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)
    uploader.drain()
    session.run(5, checkpoint_every=5)
    return durable, node, tiered, session


def test_same_host_resumes_from_its_newer_local_commit(tmp_path: Path) -> None:
    durable, _, tiered, trained = _trained(tmp_path)
    assert latest_committed(durable, RUN) is not None and latest_committed(durable, RUN).step == 10  # type: ignore[union-attr]
    session, source = _resume(tiered, durable, small_config())
    assert source == "local" and session.state.step == 15
    assert compare_states(session.state, trained.state) == []
    assert session.store is tiered


def test_same_host_at_the_durable_latest_restores_the_local_copy(tmp_path: Path) -> None:
    durable, node, tiered, trained = _trained(tmp_path)
    node.uploader.drain()  # type: ignore[attr-defined]
    session, source = _resume(tiered, durable, small_config())
    assert (source, session.state.step) == ("local", 15)


def test_another_host_resumes_from_the_last_durable_commit(tmp_path: Path) -> None:
    durable, node, _, _ = _trained(tmp_path)
    _, elsewhere, _ = _tier(tmp_path, durable, name="other-host")
    session, source = _resume(elsewhere, durable, small_config())
    assert (source, session.state.step) == ("durable", 10)
    reference = TrainingSession.fresh("reference", LocalStore(tmp_path / "ref"), small_config())
    reference.run(10)
    assert compare_states(session.state, reference.state) == []


def test_a_flipped_byte_in_the_local_copy_is_detected_and_the_durable_copy_used(tmp_path: Path) -> None:
    """Fail-first: without the verification fallback of ``resume_tiered`` this restore raises
    ``IntegrityError`` (or, reading bytes unchecked, resumes a corrupt state)."""
    durable, node, tiered, _ = _trained(tmp_path)
    shard = next(o for o in tiered.local.list(f"{RUN}/training/000000000015/") if o.key.endswith(".bin"))
    path = tiered.local.root / shard.key
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x40
    path.write_bytes(raw)
    session, source = _resume(tiered, durable, small_config())
    assert (source, session.state.step) == ("durable", 10)
    assert not path.exists() and tiered.newest(RUN) is not None and tiered.newest(RUN).ref.step == 10  # type: ignore[union-attr]
    assert node.stats.discarded == 1


def test_a_local_commit_that_differs_from_the_durable_one_is_discarded(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    TrainingSession.fresh(RUN, durable, small_config(seed=5)).run(5, checkpoint_every=5)  # the durable truth
    node, tiered, _ = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config(seed=5, batch_size=4)).run(5, checkpoint_every=5)
    session, source = _resume(tiered, durable, small_config(seed=5))
    assert (source, session.state.step) == ("durable", 5)
    assert tiered.newest(RUN) is None and node.stats.discarded == 1


def test_a_run_that_lost_an_upload_conflict_never_resumes_from_its_local_commits(tmp_path: Path) -> None:
    """Fail-first: the local 15 (descended from the losing 10) was restored."""
    durable = LocalStore(tmp_path / "durable")
    TrainingSession.fresh(RUN, durable, small_config(seed=99)).run(10, checkpoint_every=10)  # the other writer
    _, tiered, uploader = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(15, checkpoint_every=5)
    uploader.drain()  # 5 uploaded, 10 conflicts
    assert local_candidate(tiered, durable, RUN, CheckpointOptions.from_env()) is None
    with pytest.raises(CheckpointConflictError):
        _resume(tiered, durable, small_config())


def test_a_wiped_and_recreated_store_is_not_resumed_from_an_old_local_copy(tmp_path: Path) -> None:
    """Fail-first: the durable store had nothing of the run, so the old local 15 was used."""
    durable = LocalStore(tmp_path / "durable")
    store_identity(durable, create=True)
    node, tiered, uploader = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(15, checkpoint_every=5)
    uploader.drain()
    shutil.rmtree(tmp_path / "durable")
    store_identity(durable, create=True)
    session, source = _resume(node.tiered(durable.url, durable), durable, small_config())
    assert (source, session.state.step) == ("fresh", 0)
    assert tiered.newest(RUN) is None


def test_with_nothing_durable_a_local_copy_of_the_same_store_identity_is_used(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    store_identity(durable, create=True)
    _, tiered, _ = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(5, checkpoint_every=5)  # not uploaded
    session, source = _resume(tiered, durable, small_config())
    assert (source, session.state.step) == ("local", 5)
