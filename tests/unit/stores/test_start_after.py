"""``Store.list(prefix, start_after=...)``: exactly the keys of the full listing that sort after
the bound, and on disk without entering the directories that sort wholly before it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.checkpoint.layout import checkpoint_prefix, latest_key, steps_after
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Store

KEYS = [
    "run/training/000000000001/manifest.json",
    "run/training/000000000001/n1/rank000-0000.bin",
    "run/training/000000000002/manifest.json",
    "run/training/000000000002/n2/rank000-0000.bin",
    "run/training/000000000002/n2/rank001-0000.bin",
    "run/training/000000000010/n3/rank000-0000.bin",
    "run/training/000000000011/manifest.json",
    "run/training/000000000011/n4/rank000-0000.bin",
    latest_key("run", "training"),
    "run/training/0000000000/odd.bin",
    "run/trainingx/000000000005/manifest.json",
    "run/pins/best.json",
    "other/training/000000000003/manifest.json",
]
BOUNDS = [
    None,
    "",
    steps_after("run", "training", 1),
    steps_after("run", "training", 2),
    steps_after("run", "training", 11),
    checkpoint_prefix("run", "training", 2),
    "run/training/000000000002/n2/rank000-0000.bin",
    "run/training/000000000002/n",
    "run/training/0",
    "run/training/latest",
    "run/training/z",
    "run/a",
    "zzz",
]
PREFIXES = ["", "run/", "run/training/", "run/training/0000000000", "run/training/000000000002/", "other/", "nope/"]


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    store: Store = MemoryStore("start-after") if request.param == "memory" else LocalStore(tmp_path / "store")
    for key in KEYS:
        store.write_object(key, [key.encode()])
    return store


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("bound", BOUNDS)
def test_start_after_is_the_full_listing_filtered(store: Store, prefix: str, bound: str | None) -> None:
    everything = sorted(o.key for o in store.list(prefix))
    expected = [k for k in everything if bound is None or k > bound]
    assert sorted(o.key for o in store.list(prefix, start_after=bound)) == expected


def test_steps_after_separates_steps() -> None:
    bound = steps_after("run", "training", 2)
    for step, after in ((1, False), (2, False), (3, True), (10**11, True)):
        prefix = checkpoint_prefix("run", "training", step)
        assert (f"{prefix}/manifest.json" > bound) is after
        assert (f"{prefix}/a/rank000-0000.bin" > bound) is after


def test_local_listing_does_not_enter_directories_before_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store")
    for step in range(1, 201):
        store.write_object(f"{checkpoint_prefix('run', 'training', step)}/n/rank000-0000.bin", [b"x"])
    entered: list[str] = []
    real = os.scandir

    def counting(path: Any) -> Iterator[os.DirEntry[str]]:
        entered.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    keys = [o.key for o in store.list("run/training/", start_after=steps_after("run", "training", 198))]
    assert sorted(keys) == [f"{checkpoint_prefix('run', 'training', s)}/n/rank000-0000.bin" for s in (199, 200)]
    # the kind's directory, then two steps and their nonce directories: nothing of steps <= 198
    assert len(entered) == 1 + 2 * 2, entered
