"""A run's footing in its store (``cairn.runs.ownership``): absolute store URLs, store identities,
one owner per run id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.errors import RunOwnershipError, StoreIdentityError
from cairn.runs.ownership import claim_run, read_owner, require_store_identity, store_url_problem
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.identity import STORE_ID_KEY, store_identity


@pytest.mark.parametrize(
    "url, ok",
    [
        ("/abs/store", True),
        ("file:///abs/store", True),
        ("s3://bucket/prefix", True),
        ("s3://bucket", True),
        (".cairn/store", False),
        ("runs", False),
        ("", False),
        ("s3://", False),
        ("s3://Bad_Bucket/x", False),
        ("ftp://host/x", False),
        ("memory://x", False),
        ("/abs/with\nnewline", False),
    ],
)
def test_store_url_rules(url: str, ok: bool) -> None:
    assert (store_url_problem(url) is None) == ok


def test_store_identity_is_created_once_and_checked(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a")
    assert store_identity(store, create=False) is None
    first = store_identity(store, create=True)
    assert first is not None and store_identity(store, create=True) == first
    require_store_identity(store, first)
    require_store_identity(store, None)  # runs that predate identities
    other = LocalStore(tmp_path / "b")  # "another host's directory": no identity at all
    with pytest.raises(StoreIdentityError, match="shared"):
        require_store_identity(other, first)
    store_identity(other, create=True)
    with pytest.raises(StoreIdentityError):
        require_store_identity(other, first)
    store.write_object(STORE_ID_KEY, [b"{not json"])
    with pytest.raises(StoreIdentityError, match=r"store identity\): not valid JSON"):
        store_identity(store, create=False)


def test_one_workflow_per_run_id() -> None:
    store = MemoryStore("owners")
    alive = {"wf-a"}
    claim_run(store, "run", "wf-a", "s", owner_running=alive.__contains__)
    claim_run(store, "run", "wf-a", "s", owner_running=alive.__contains__)  # a retry: fine
    with pytest.raises(RunOwnershipError, match="wf-a"):
        claim_run(store, "run", "wf-b", "s", owner_running=alive.__contains__)
    alive.clear()  # wf-a closed (or was terminated): a new workflow takes over
    claim_run(store, "run", "wf-b", "s", owner_running=alive.__contains__)
    owner = read_owner(store, "run")
    assert owner is not None and owner.workflow_id == "wf-b"


def test_two_takeovers_at_once_leave_one_owner() -> None:
    """B and C both see the closed owner A; C's claim lands first, B's create-if-absent of the
    same number fails, B re-reads, finds C running, and is refused."""
    from cairn.checkpoint.layout import owner_key
    from cairn.runs.ownership import require_run_owner

    class RacingStore(MemoryStore):
        raced = False

        def put_if_absent(self, key: str, data: bytes) -> bool:
            if key == owner_key("run", 1) and not self.raced:
                self.raced = True  # C wins the race just before B's write
                body = json.dumps({"run_id": "run", "workflow_id": "wf-c", "store_id": "s", "claimed_at": "t"})
                super().put_if_absent(key, body.encode())
            return super().put_if_absent(key, data)

    store = RacingStore("race")
    claim_run(store, "run", "wf-a", "s", owner_running=lambda _: False)
    running = {"wf-c"}
    with pytest.raises(RunOwnershipError, match="wf-c"):
        claim_run(store, "run", "wf-b", "s", owner_running=running.__contains__)
    owner = read_owner(store, "run")
    assert owner is not None and owner.workflow_id == "wf-c"
    require_run_owner(store, "run", "wf-c")
    with pytest.raises(RunOwnershipError, match="now belongs to workflow 'wf-c'"):
        require_run_owner(store, "run", "wf-a")  # A's stale segment stops instead of training on
