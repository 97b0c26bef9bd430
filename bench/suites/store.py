# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Save and restore vs the floor of the same store, for several state sizes, side by side.

Floor: the same number of bytes moved by plain sequential I/O on the same store in the same
run — one file written (+ fsync) / read into one fresh buffer on local disk; one tuned boto3
multipart upload / parallel download on S3 (SeaweedFS on loopback, started here; the store's
part size, concurrency and unsigned bodies: ``bench.harness.floor.s3_floor``). Ours:
``save_training`` (BLAKE3 of every byte, shards, manifest commit) and ``load_training`` (full
validation: checksums, finiteness, v >= 0, invariants). Restores read from the device: every
file's pages are evicted first (both sides).

Reports per size and op: median and min-max seconds of N interleaved reps, MB/s, ratio =
floor seconds / our seconds (>= 1.0: at least as fast as the floor), and the peak extra RSS
of one (untimed) call of each, vs the state size.
Rendered by ``bench.sections.store``.
Run: ``python -m bench.suites.store [--sizes 64,256,1024] [--reps 5] [--only local|s3] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.floor import ArraysReader, BufferWriter, floor_read_file, floor_write_file, s3_floor
from bench.harness.machine import machine
from bench.harness.measure import drop_cache, interleaved, measure_rss, stats
from bench.harness.previous_reader import previous_reader
from bench.harness.results import RESULTS, write_result
from bench.harness.servers import seaweedfs
from bench.harness.states import UNSIGNED, big_state, state_arrays, state_bytes
from cairn.checkpoint import latest_committed
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.training import load_training, save_training


def load_before_fix(store: Any, ref: Any) -> object:
    """``load_training`` with the read path as it was before the fix (``bench.harness.previous_reader``)."""
    with previous_reader():
        return load_training(store, ref, options=UNSIGNED)


def bench_local(state: TrainState, reps: int, workdir: Path) -> dict[str, Any]:
    nbytes = state_bytes(state)
    arrays = state_arrays(state)
    floor_file = workdir / "floor.bin"
    store = LocalStore(workdir / "store")

    def fresh_files(_name: str) -> None:  # both sides write new files every rep
        floor_file.unlink(missing_ok=True)
        store.delete([o.key for o in store.list("bench/")])
        os.sync()

    saves = interleaved(
        {
            "floor": lambda: floor_write_file(arrays, floor_file),
            "cairn": lambda: save_training(store, "bench", state, options=UNSIGNED),
        },
        reps,
        before=fresh_files,
    )
    fresh_files("")
    rss_save = {
        "floor": measure_rss(lambda: floor_write_file(arrays, floor_file)),
        "cairn": measure_rss(lambda: save_training(store, "bench", state, options=UNSIGNED)),
    }
    ref = latest_committed(store, "bench")
    assert ref is not None
    restores = interleaved(
        {
            "floor": lambda: floor_read_file(floor_file, nbytes),
            "cairn": lambda: load_training(store, ref, options=UNSIGNED),
            "cairn_before_fix": lambda: load_before_fix(store, ref),
        },
        reps,
        before=lambda _name: (gc.collect(), drop_cache(workdir)),
    )
    drop_cache(workdir)
    rss_restore = {"floor": measure_rss(lambda: floor_read_file(floor_file, nbytes))}
    drop_cache(workdir)
    rss_restore["cairn"] = measure_rss(lambda: load_training(store, ref, options=UNSIGNED))
    restored, _ = load_training(store, ref, options=UNSIGNED)
    for group in ("params", "m", "v"):  # bit-exact
        mine, theirs = getattr(state, group), getattr(restored, group)
        assert set(mine) == set(theirs) and all(mine[k].tobytes() == theirs[k].tobytes() for k in mine)
    del restored
    return _result(nbytes, saves, restores, rss_save, rss_restore)


def bench_s3(state: TrainState, reps: int, workdir: Path, endpoint: str) -> dict[str, Any]:
    from cairn.stores.s3 import S3Store

    nbytes = state_bytes(state)
    arrays = state_arrays(state)
    bucket = f"bench-{uuid.uuid4().hex[:6]}"
    store = S3Store(bucket, "cairn", endpoint_url=endpoint)
    store.ensure_bucket()
    client, tc = s3_floor(endpoint)

    def floor_up() -> None:
        client.upload_fileobj(ArraysReader(arrays), bucket, "floor.bin", Config=tc)

    def floor_down() -> np.ndarray:
        out = BufferWriter(nbytes)
        client.download_fileobj(bucket, "floor.bin", out, Config=tc)
        return out.buf

    def clear(_name: str = "") -> None:  # untimed: each save writes a fresh checkpoint
        store.delete([o.key for o in store.list("")])

    saves = interleaved(
        {"floor": floor_up, "cairn": lambda: save_training(store, "bench", state, options=UNSIGNED)},
        reps,
        before=clear,
    )
    clear()
    rss_save = {
        "floor": measure_rss(floor_up),
        "cairn": measure_rss(lambda: save_training(store, "bench", state, options=UNSIGNED)),
    }
    ref = latest_committed(store, "bench")
    assert ref is not None
    restores = interleaved(
        {
            "floor": floor_down,
            "cairn": lambda: load_training(store, ref, options=UNSIGNED),
            "cairn_before_fix": lambda: load_before_fix(store, ref),
        },
        reps,
    )
    rss_restore = {
        "floor": measure_rss(floor_down),
        "cairn": measure_rss(lambda: load_training(store, ref, options=UNSIGNED)),
    }
    split = restore_split(store, ref, floor_down, reps)
    clear()
    client.delete_object(Bucket=bucket, Key="floor.bin")
    store.close()
    return {**_result(nbytes, saves, restores, rss_save, rss_restore), "restore_split": split}


def _busy_jiffies() -> tuple[int, int]:
    """(busy, all) CPU jiffies of the whole machine so far (``/proc/stat``): the S3 server's too."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def restore_split(store: Any, ref: Any, floor_down: Any, reps: int) -> dict[str, Any]:
    """Where an S3 restore's time goes: the floor's download and how many of the machine's cores
    it keeps busy (client and SeaweedFS together), and Cairn's checks alone — the same
    ``load_training`` from a copy of the checkpoint in memory (hashing, value checks, the copy
    into fresh arrays; no network)."""
    from cairn.stores.memory import MemoryStore

    memory = MemoryStore()
    for obj in store.list(""):
        memory.write_object(obj.key, [store.read(obj.key, 1 << 30)])
    busy: list[float] = []
    for _ in range(reps):
        b0, t0 = _busy_jiffies()
        floor_down()
        b1, t1 = _busy_jiffies()
        busy.append((b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1))
    checks = interleaved({"checks_only": lambda: load_training(memory, ref, options=UNSIGNED)}, reps)["checks_only"]
    return {"floor_busy_cores": stats(busy), "checks_only": stats(checks), "cores": os.cpu_count() or 1}


def _result(
    nbytes: int,
    saves: dict[str, list[float]],
    restores: dict[str, list[float]],
    rss_save: dict[str, int],
    rss_restore: dict[str, int],
) -> dict[str, Any]:
    out: dict[str, Any] = {"bytes": nbytes}
    for op, times, rss in (("save", saves, rss_save), ("restore", restores, rss_restore)):
        floor, ours = stats(times["floor"]), stats(times["cairn"])
        # ratio per rep pair (same rep, adjacent in time), and of the medians
        pairs = [f / o for f, o in zip(times["floor"], times["cairn"], strict=True)]
        out[op] = {
            "floor": floor,
            "cairn": ours,
            "ratio": floor["median"] / ours["median"],
            "ratio_per_rep": stats(pairs),
            "peak_extra_rss": rss,
        }
        if "cairn_before_fix" in times:
            before = stats(times["cairn_before_fix"])
            out[op]["cairn_before_fix"] = before
            out[op]["ratio_before_fix"] = floor["median"] / before["median"]
    return out


def report(store: str, mib: int, r: dict[str, Any]) -> None:
    for op in ("save", "restore"):
        f, o = r[op]["floor"], r[op]["cairn"]
        mb = r["bytes"] / 1e6
        print(
            f"{store:<5} {mib:>5} MiB {op:<8} floor {f['median']:7.3f}s {mb / f['median']:7.0f} MB/s"
            f"  cairn {o['median']:7.3f}s {mb / o['median']:7.0f} MB/s  ratio {r[op]['ratio']:.2f}x"
            + (f" (before fix {r[op]['ratio_before_fix']:.2f}x)" if "ratio_before_fix" in r[op] else "")
            + ""
            f"  rss floor {r[op]['peak_extra_rss']['floor'] / 2**20:6.0f} MiB"
            f" cairn {r[op]['peak_extra_rss']['cairn'] / 2**20:6.0f} MiB",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024", help="state sizes in MiB, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=["local", "s3"])
    parser.add_argument("--quick", action="store_true", help="16 MiB, 3 reps: a smoke run")
    args = parser.parse_args()
    sizes = [16] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 3 if args.quick else args.reps
    results: dict[str, dict[str, Any]] = {"local": {}, "s3": {}}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-store-") as tmp:
        endpoint_cm = seaweedfs(Path(tmp) / "s3") if args.only != "local" else None
        endpoint = endpoint_cm.__enter__() if endpoint_cm else None
        try:
            for mib in sizes:
                state = big_state(mib)
                if args.only in (None, "local"):
                    work = Path(tmp) / f"local-{mib}"
                    work.mkdir()
                    results["local"][str(mib)] = r = bench_local(state, reps, work)
                    report("local", mib, r)
                    import shutil

                    shutil.rmtree(work)
                if endpoint is not None:
                    results["s3"][str(mib)] = r = bench_s3(state, reps, Path(tmp), endpoint)
                    report("s3", mib, r)
                del state
                gc.collect()
        finally:
            if endpoint_cm is not None:
                endpoint_cm.__exit__(None, None, None)
    if args.only and not args.quick:  # keep the other store's results of the last full run
        import json

        previous = RESULTS / "store.json"
        if previous.exists():
            other = "s3" if args.only == "local" else "local"
            results[other] = json.loads(previous.read_text())["results"].get(other, {})
    write_result(
        "store", {"machine": machine(), "reps": reps, "sizes_mib": sizes, "results": results}, quick=args.quick
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
