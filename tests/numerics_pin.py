"""A pytest plugin (``-p tests.numerics_pin`` in pyproject): the suite computes under the default
numerics profile on any x86-64 machine, AVX2 or AVX-512. Loaded before any conftest, so the pin is
set before numpy is imported; every worker and command the tests start inherits it."""

from __future__ import annotations

import os
import sys

from cairn.numerics import DEFAULT_PROFILE, pin_environment

if "numpy" in sys.modules:  # a plugin imported it first: the pin could not take effect
    raise RuntimeError("tests.numerics_pin must load before numpy (it is the first plugin in pyproject's addopts)")
pin_environment(os.environ.get("CAIRN_TEST_NUMERICS") or DEFAULT_PROFILE)
