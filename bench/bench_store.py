"""Save/restore a 256 MiB training state against the floor of the same store, side by side.

Floor: a plain sequential write (+ fsync) / read of the same number of bytes to the same store
— one file on local disk; one tuned boto3 multipart upload/download on S3 (SeaweedFS, started
here). Ours: ``save_training`` (hashing every byte, shards, manifest commit) and
``load_training`` (full validation: checksums, finiteness, invariants).

Prints bytes, median seconds of N repetitions, MB/s and ratio = floor_seconds / our_seconds
(1.0 = as fast as the floor). Writes bench/out/store.json and bench/out/store.png.
Run: ``make bench`` (or ``python bench/bench_store.py --reps 5 --mib 256``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cairn.checkpoint import CheckpointOptions, latest_committed, load_training, save_training  # noqa: E402
from cairn.config import TrainConfig  # noqa: E402
from cairn.data import load_dataset  # noqa: E402
from cairn.stores import LocalStore  # noqa: E402
from cairn.trainer import init_state  # noqa: E402

UNSIGNED = CheckpointOptions()  # the bench measures bytes, not HMAC

OUT = REPO / "bench" / "out"


def big_state(mib: int):  # type: ignore[no-untyped-def]
    """A real TrainState whose theta + m + v total about ``mib`` MiB."""
    d, c = 2048, 8
    hidden = max(1, int(mib * (1 << 20) / 8 / 3 / (d + c + 1)))
    cfg = TrainConfig.model_validate(
        {"model": {"hidden": hidden}, "data": {"n_examples": 64, "n_features": d, "n_classes": c}}
    )
    state = init_state(cfg, load_dataset(cfg.data))
    rng = np.random.default_rng(0)
    for name in state.params:  # non-trivial moments, as after real training
        state.m[name][...] = rng.standard_normal(state.m[name].shape) * 1e-3
        state.v[name][...] = np.abs(rng.standard_normal(state.v[name].shape)) * 1e-6
    return state


def drop_cache(root: Path) -> None:
    """Evict the files' pages so reads hit the device (pages are clean after fsync)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def side_by_side(
    floor: Callable[[], object],
    ours: Callable[[], object],
    reps: int,
    before: Callable[[], object] = lambda: None,
) -> tuple[float, float]:
    """Median seconds of each, the two interleaved rep by rep so drift hits both alike.
    ``before`` (untimed) runs before every timed call: cleanup, cache eviction."""
    times: dict[str, list[float]] = {"floor": [], "ours": []}
    for _ in range(reps):
        for name, fn in (("floor", floor), ("ours", ours)):
            before()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["floor"]), statistics.median(times["ours"])


def bench_local(state, reps: int, workdir: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    nbytes = sum(a.nbytes for a in [*state.params.values(), *state.m.values(), *state.v.values()])
    blob = np.concatenate([a.reshape(-1) for a in [*state.params.values(), *state.m.values(), *state.v.values()]])
    floor_file = workdir / "floor.bin"

    def floor_write() -> None:
        with open(floor_file, "wb", buffering=0) as f:
            f.write(memoryview(blob).cast("B"))
            os.fsync(f.fileno())

    def floor_read() -> None:
        out = np.empty_like(blob)
        with open(floor_file, "rb", buffering=0) as f:
            f.readinto(memoryview(out).cast("B"))

    store = LocalStore(workdir / "store")

    def ours_save() -> None:
        save_training(store, "bench", state, options=UNSIGNED)

    def fresh_files() -> None:  # both sides write new files every rep, nothing left over
        floor_file.unlink(missing_ok=True)
        store.delete([o.key for o in store.list("bench/")])
        os.sync()

    results = {"bytes": nbytes}
    results["floor_save_s"], results["ours_save_s"] = side_by_side(floor_write, ours_save, reps, before=fresh_files)
    floor_write()
    ours_save()
    ref = latest_committed(store, "bench")
    assert ref is not None
    results["floor_restore_s"], results["ours_restore_s"] = side_by_side(
        floor_read, lambda: load_training(store, ref, options=UNSIGNED), reps, before=lambda: drop_cache(workdir)
    )
    return results


def bench_s3(state, reps: int, workdir: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    from cairn.stores.s3 import S3Store
    from workers.servers import ServerProcess, free_port, seaweedfs_command, wait_for_http

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    (workdir / "weed").mkdir()
    server = ServerProcess("seaweedfs", seaweedfs_command(workdir / "weed", port), workdir / "weed.log").start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for_http(endpoint + "/", timeout=60, alive=server.alive)
        store = S3Store("bench", f"run-{uuid.uuid4().hex[:6]}", endpoint_url=endpoint)
        store.ensure_bucket()
        client = boto3.client(
            "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}, max_pool_connections=16)
        )
        blob = np.concatenate([a.reshape(-1) for a in [*state.params.values(), *state.m.values(), *state.v.values()]])
        tc = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)

        def floor_up() -> None:
            client.upload_fileobj(io.BytesIO(memoryview(blob).cast("B")), "bench", "floor.bin", Config=tc)

        def floor_down() -> None:
            buf = io.BytesIO()
            client.download_fileobj("bench", "floor.bin", buf, Config=tc)

        counter = iter(range(10**6))
        results = {"bytes": blob.nbytes}
        results["floor_save_s"], results["ours_save_s"] = side_by_side(
            floor_up, lambda: save_training(store, f"b{next(counter)}", state, options=UNSIGNED), reps
        )
        ref = latest_committed(store, "b0")
        assert ref is not None
        results["floor_restore_s"], results["ours_restore_s"] = side_by_side(
            floor_down, lambda: load_training(store, ref, options=UNSIGNED), reps
        )
        store.close()
        return results
    finally:
        server.stop(grace=2.0)


def report(name: str, r: dict[str, float]) -> dict[str, float]:
    mb = r["bytes"] / 1e6
    out = dict(r)
    for op in ("save", "restore"):
        out[f"{op}_ratio"] = r[f"floor_{op}_s"] / r[f"ours_{op}_s"]
        floor_s, ours_s = r[f"floor_{op}_s"], r[f"ours_{op}_s"]
        print(
            f"{name:<6} {op:<8} {int(r['bytes']):>11} B  floor {floor_s:7.3f}s {mb / floor_s:8.1f} MB/s"
            f"   ours {ours_s:7.3f}s {mb / ours_s:8.1f} MB/s   ratio {out[f'{op}_ratio']:.2f}x"
        )
    return out


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, floor, ours = [], [], []
    for store, r in results.items():
        for op in ("save", "restore"):
            labels.append(f"{store}\n{op}")
            floor.append(r["bytes"] / 1e6 / r[f"floor_{op}_s"])
            ours.append(r["bytes"] / 1e6 / r[f"ours_{op}_s"])
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.2, floor, 0.4, label="floor (plain sequential I/O)")
    ax.bar(x + 0.2, ours, 0.4, label="cairn (hash + shards + commit / validate)")
    ax.set_xticks(x, labels)
    ax.set_ylabel("MB/s (median)")
    ax.set_title("256 MiB training state: cairn vs the store's floor")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=["local", "s3"])
    args = parser.parse_args()
    state = big_state(args.mib)
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=REPO / ".cairn" if (REPO / ".cairn").exists() else None) as tmp:
        if args.only in (None, "local"):
            (Path(tmp) / "local").mkdir()
            results["local"] = report("local", bench_local(state, args.reps, Path(tmp) / "local"))
        if args.only in (None, "s3"):
            (Path(tmp) / "s3").mkdir()
            results["s3"] = report("s3", bench_s3(state, args.reps, Path(tmp) / "s3"))
    (OUT / "store.json").write_text(json.dumps({"reps": args.reps, "mib": args.mib, "results": results}, indent=1))
    plot(results, OUT / "store.png")
    print(f"wrote {OUT / 'store.json'} and {OUT / 'store.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
