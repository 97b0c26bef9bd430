"""What every benchmark process sets up before numpy loads: the numerics profile's pins (a
benchmark run alone computes under the default profile, as under ``bench.run_all``) and a fixed
mmap threshold. ``bench/suites/__init__.py`` calls ``prepare_process`` first."""

from __future__ import annotations

import contextlib
import sys

from cairn.numerics import pin_environment, process_profile_name


def _fixed_mmap_threshold() -> None:
    """Large buffers come from mmap and go back to the OS when freed, as in a fresh process:
    glibc otherwise raises its mmap threshold after the first free of a large block and keeps
    later ones in the heap, which would hide page-fault costs and the RSS a call really adds."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB, fixed


def prepare_process() -> None:
    if "numpy" not in sys.modules:  # numpy and BLAS read the pins once, at import
        pin_environment(process_profile_name())
    _fixed_mmap_threshold()
