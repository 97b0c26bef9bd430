"""The worker's tier settings (``activities.tier``)."""

from __future__ import annotations

import pytest

from activities.tier import parse_bytes
from cairn.errors import ConfigError


@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("8GiB", 8 << 30), ("512M", 512 << 20), ("1tb", 1 << 40)])
def test_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5G", "lots"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--local-tier-bytes"):
        parse_bytes(text)
