"""The in-memory store (``cairn.stores.memory``) refuses the malformed keys LocalStore refuses."""

from __future__ import annotations

import pytest

from cairn import errors as E
from cairn.stores import MemoryStore


@pytest.mark.parametrize("key", ["../escape", "a\nb"])
def test_memory_store_refuses_the_same_keys(key: str) -> None:
    with pytest.raises(E.InvalidObjectError):
        MemoryStore().write_object(key, [b"x"])
