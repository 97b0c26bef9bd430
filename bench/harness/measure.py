"""How the benchmarks time and weigh a call: cases interleaved rep by rep, a median with its
min–max, peak extra RSS sampled while a call runs, and the page cache evicted before a read."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MiB = 1 << 20


def interleaved(
    cases: dict[str, Callable[[], object]],
    reps: int,
    before: Callable[[str], object] = lambda _name: None,
) -> dict[str, list[float]]:
    """Seconds of each case per rep, the cases interleaved rep by rep (and their order rotated
    every rep) so that drift and other load on the machine hit all of them alike. ``before``
    (untimed) runs before every timed call: cleanup, cache eviction."""
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            before(name)
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    return times


def stats(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
        "samples": samples,
    }


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def peak_rss(interval: float = 0.002) -> Iterator[dict[str, int]]:
    """Peak resident memory above the level at entry, sampled from /proc every ``interval``
    seconds while the block runs (``out["peak_extra"]`` after the block)."""
    out = {"baseline": _rss_bytes(), "peak_extra": 0}
    stop = threading.Event()

    def sample() -> None:
        peak = out["baseline"]
        while not stop.is_set():
            peak = max(peak, _rss_bytes())
            stop.wait(interval)
        out["peak_extra"] = max(0, max(peak, _rss_bytes()) - out["baseline"])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


def measure_rss(fn: Callable[[], object]) -> int:
    """Peak extra RSS of one call of ``fn`` (its result is dropped after the call)."""
    import gc

    gc.collect()
    with peak_rss() as rss:
        result = fn()
    del result
    gc.collect()
    return rss["peak_extra"]


def drop_cache(root: Path) -> None:
    """Evict the files' pages so that reads hit the device (pages are clean after fsync)."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
