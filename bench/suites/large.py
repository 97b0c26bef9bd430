# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Proof on this machine: the largest training-like state it holds twice over, saved and
restored for real, to local disk and to SeaweedFS, beside the floor of the same bytes.

The state: the first 2 of Llama-2-7B's 32 decoder layers (hidden 4096, intermediate 11008, 32
heads) with its embedding and head (vocabulary 32000), HF names, in four groups — bf16
weights and Adam's fp32 master weights, exp_avg and exp_avg_sq (14 bytes a parameter) —
filled with training-like random values (incompressible): 9.34 GB. Cairn's save is
``write_checkpoint`` with 64 MiB blocks (format v3: one rank index, a root manifest), its
restore ``read_manifest`` + ``read_logical`` (every block's BLAKE3 checked; a second restore
also applies the value rules a trainer applies: finite, ``exp_avg_sq`` >= 0). The floor is the
same bytes moved by plain sequential I/O on the same store (``bench.harness.floor``: one file written
+ fsync / read into one fresh buffer; one boto3 multipart upload / download with Cairn's part
size and concurrency). Every save runs in a process that builds the state (floor and Cairn
interleaved); every restore runs in a fresh process that holds only its own copy; the page
cache is dropped (``echo 3 > /proc/sys/vm/drop_caches``, as root) before every restore, floor
and Cairn alike. Peak memory: the process's VmHWM (reset through ``/proc/self/clear_refs``
before each operation) above its RSS before it. Reps are few (the state is large): see ``--reps``.
Rendered by ``bench.sections.large``.
Run (as root): ``python -m bench.suites.large [--reps-local 2] [--reps-s3 1] [--only local|s3] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.floor import ArraysReader, BufferWriter, floor_read_file, floor_write_file, s3_floor
from bench.harness.machine import machine
from bench.harness.measure import MiB
from bench.harness.results import REPO, write_result
from bench.harness.servers import seaweedfs
from bench.harness.states import UNSIGNED
from cairn.checkpoint import CheckpointContent, CheckpointKind, read_manifest, write_checkpoint
from cairn.checkpoint.reader import read_logical
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import BFLOAT16
from cairn.errors import InvariantError
from cairn.stores.base import Store
from cairn.trainers.base import check_finite

BLOCK_BYTES = 64 * MiB
HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 4096, 11008, 32000, 2
GROUPS = {"weights": BFLOAT16, "master": np.dtype("<f4"), "exp_avg": np.dtype("<f4"), "exp_avg_sq": np.dtype("<f4")}
SCALE = {"master": 0.02, "exp_avg": 1e-3, "exp_avg_sq": 1e-6}
"""Values: master ~ U(-0.02, 0.02) (weights its bf16 rounding), exp_avg ~ U(-1e-3, 1e-3), exp_avg_sq ~ U(0, 1e-6)."""
RUN = "large"
CHUNK = 1 << 26  # elements filled at a time


def llama_shapes(layers: int = LAYERS, hidden: int = HIDDEN) -> dict[str, tuple[int, ...]]:
    """The parameters of the first ``layers`` decoder layers of a Llama-2-7B-class model."""
    inter = INTERMEDIATE if hidden == HIDDEN else hidden * 2
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, hidden),
        "lm_head.weight": (VOCAB, hidden),
        "model.norm.weight": (hidden,),
    }
    for n in range(layers):
        p = f"model.layers.{n}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{proj}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    return shapes


def build_state(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """Every group of every parameter, filled in place chunk by chunk (no temporary copy)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        master = np.empty(shape, dtype=GROUPS["master"])
        weights = np.empty(shape, dtype=GROUPS["weights"])
        m, v = np.empty(shape, dtype=GROUPS["exp_avg"]), np.empty(shape, dtype=GROUPS["exp_avg_sq"])
        fm, fw, fa, fs = (a.reshape(-1) for a in (master, weights, m, v))
        for start in range(0, fm.size, CHUNK):
            stop = min(fm.size, start + CHUNK)
            for flat, key, signed in ((fm, "master", True), (fa, "exp_avg", True), (fs, "exp_avg_sq", False)):
                chunk = flat[start:stop]
                rng.random(out=chunk, dtype=np.float32)
                if signed:
                    chunk -= 0.5
                    chunk *= 2 * SCALE[key]
                else:
                    chunk *= SCALE[key]
            fw[start:stop] = fm[start:stop].astype(BFLOAT16)
        out |= {f"weights/{name}": weights, f"master/{name}": master, f"exp_avg/{name}": m, f"exp_avg_sq/{name}": v}
    return out


def digest(arrays: dict[str, np.ndarray]) -> str:
    """BLAKE3 over every tensor's bytes in name order (bit-exactness of a restore)."""
    from blake3 import blake3

    h = blake3(max_threads=blake3.AUTO)
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(memoryview(np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
    return h.hexdigest()


def check_values(name: str, values: np.ndarray) -> None:
    """A trainer's value rules: floats finite; second moments >= 0."""
    check_finite(name, values)
    if name.startswith("exp_avg_sq/") and values.size and values.min() < 0:
        raise InvariantError("second moment < 0", field=f"tensors[{name}]")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # 5: reset the peak RSS (VmHWM) to the current RSS
        f.write("5")


def measured(fn: Any) -> dict[str, Any]:
    """Seconds of ``fn()``, and the process's peak RSS during it above its RSS before it."""
    import gc

    gc.collect()
    _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "rss_before": before, "peak": _status("VmHWM")}
    out["peak_extra"] = out["peak"] - before
    return out | ({"result": result} if isinstance(result, str | int | float) else {})


def _store(args: argparse.Namespace) -> Store:
    if args.target == "local":
        from cairn.stores import LocalStore

        return LocalStore(Path(args.dir) / "store")
    from cairn.stores.s3 import S3Store

    return S3Store(args.bucket, "cairn", endpoint_url=args.endpoint)


def _content() -> CheckpointContent:
    return CheckpointContent(kind=CheckpointKind.TRAINING, run_id=RUN, step=1, meta={"model": "llama-2-7b, 2 layers"})


def _save_op(
    args: argparse.Namespace, op: str, store: Store, arrays: dict[str, np.ndarray], ordered: list[np.ndarray]
) -> Any:
    """The save ``op`` names: the floor's (plain I/O of the same bytes) or Cairn's."""
    if op == "floor" and args.target == "local":
        return lambda: floor_write_file(ordered, Path(args.dir) / "floor.bin")
    if op == "floor":
        client, tc = s3_floor(args.endpoint)
        return lambda: client.upload_fileobj(ArraysReader(ordered), args.bucket, "floor.bin", Config=tc)
    return lambda: write_checkpoint(store, _content(), arrays, options=UNSIGNED, block_bytes=BLOCK_BYTES).created


def role_save(args: argparse.Namespace) -> dict[str, Any]:
    """Build the state, then each save (floor and Cairn, in ``args.order``), then its digest."""
    t = time.perf_counter()
    arrays = build_state(llama_shapes(args.layers, args.hidden))
    built = time.perf_counter() - t
    nbytes = sum(a.nbytes for a in arrays.values())
    ordered = [arrays[n] for n in sorted(arrays)]
    store = _store(args)
    out: dict[str, Any] = {"bytes": nbytes, "build_seconds": built, "rss_state": _status("VmRSS")}
    for op in args.order.split(","):
        fn = _save_op(args, op, store, arrays, ordered)
        os.sync()
        out[op] = measured(fn)
        print(f"  save {args.target} {op}: {out[op]['seconds']:.1f} s", file=sys.stderr, flush=True)
    out["digest"] = digest(arrays)
    return out


def role_restore(args: argparse.Namespace) -> dict[str, Any]:
    """One restore into fresh memory: the floor's read, or Cairn's (with or without value rules)."""
    store = _store(args)
    if args.op == "floor" and args.target == "local":
        path = Path(args.dir) / "floor.bin"
        size = path.stat().st_size
        res = measured(lambda: floor_read_file(path, size).nbytes)
    elif args.op == "floor":
        client, tc = s3_floor(args.endpoint)
        size = client.head_object(Bucket=args.bucket, Key="floor.bin")["ContentLength"]

        def down() -> int:
            out = BufferWriter(size)
            client.download_fileobj(args.bucket, "floor.bin", out, Config=tc)
            return int(out.buf.nbytes)

        res = measured(down)
    else:
        ref = CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, 1)
        kept: dict[str, dict[str, np.ndarray]] = {}

        def restore() -> int:
            manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=UNSIGNED)
            check = check_values if args.op == "cairn_values" else None
            kept["arrays"] = read_logical(store, ref, manifest, max_workers=UNSIGNED.max_workers, value_check=check)
            return sum(a.nbytes for a in kept["arrays"].values())

        res = measured(restore)
        res["digest"] = digest(kept["arrays"])
    return res


def drop_caches() -> None:
    """Every clean page of the page cache evicted (root only): reads hit the device."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def child(argv: list[str], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.suites.large", *argv]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, timeout=timeout, check=True, text=True, cwd=REPO)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def bench_target(
    target: str, reps: int, workdir: Path, common_args: list[str], extra: list[str], cleanup: Any
) -> dict[str, Any]:
    reps_out = []
    for rep in range(reps):
        cleanup()
        order = ["floor", "cairn"] if rep % 2 == 0 else ["cairn", "floor"]
        saved = child(["--role", "save", "--target", target, "--order", ",".join(order), *common_args, *extra], 1800)
        restores: dict[str, Any] = {}
        cases = ["floor", "cairn", "cairn_values"]
        shift = rep % len(cases)
        for op in cases[shift:] + cases[:shift]:
            drop_caches()
            restores[op] = child(["--role", "restore", "--target", target, "--op", op, *common_args, *extra], 1800)
            print(f"  restore {target} {op}: {restores[op]['seconds']:.1f} s", flush=True)
        for op in ("cairn", "cairn_values"):
            assert restores[op]["digest"] == saved["digest"], f"{target} {op}: not bit-exact"
            assert restores[op]["result"] == saved["bytes"]
        reps_out.append({"save": saved, "restore": restores, "order": order})
    drop_caches()
    return {"reps": reps_out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps-local", type=int, default=2)
    parser.add_argument("--reps-s3", type=int, default=1)
    parser.add_argument("--only", choices=["local", "s3"])
    parser.add_argument("--quick", action="store_true", help="hidden 64, 1 layer (~60 MB), 1 rep: a smoke run")
    parser.add_argument("--role", choices=["save", "restore"], help=argparse.SUPPRESS)
    parser.add_argument("--target", choices=["local", "s3"], help=argparse.SUPPRESS)
    parser.add_argument("--op", help=argparse.SUPPRESS)
    parser.add_argument("--order", default="floor,cairn", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--bucket", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=LAYERS, help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:  # one operation, in this process: its result as the last line
        result = role_save(args) if args.role == "save" else role_restore(args)
        print(json.dumps(result, default=float), flush=True)
        return 0
    if os.geteuid() != 0:
        print("bench.suites.large drops the page cache before every restore: run it as root")
        return 2
    layers, hidden = (1, 64) if args.quick else (LAYERS, HIDDEN)
    reps = {"local": 1 if args.quick else args.reps_local, "s3": 1 if args.quick else args.reps_s3}
    shapes = llama_shapes(layers, hidden)
    params = sum(math.prod(s) for s in shapes.values())
    started = time.perf_counter()
    at_start = machine()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-large-") as tmp:
        work = Path(tmp)
        common_args = ["--dir", str(work), "--layers", str(layers), "--hidden", str(hidden)]
        if args.only in (None, "local"):

            def clean_local() -> None:
                import shutil

                (work / "floor.bin").unlink(missing_ok=True)
                shutil.rmtree(work / "store", ignore_errors=True)

            results["local"] = bench_target("local", reps["local"], work, common_args, [], clean_local)
            clean_local()
        if args.only in (None, "s3"):
            with seaweedfs(work / "s3") as endpoint:
                from cairn.stores.s3 import S3Store

                bucket = f"large-{uuid.uuid4().hex[:6]}"
                store = S3Store(bucket, "cairn", endpoint_url=endpoint)
                store.ensure_bucket()
                client, _ = s3_floor(endpoint)

                def clean_s3() -> None:
                    store.delete([o.key for o in store.list("")])
                    client.delete_object(Bucket=bucket, Key="floor.bin")

                extra = ["--endpoint", endpoint, "--bucket", bucket]
                results["s3"] = bench_target("s3", reps["s3"], work, common_args, extra, clean_s3)
                clean_s3()
                store.close()
    nbytes = next(iter(results.values()))["reps"][0]["save"]["bytes"]
    write_result(
        "large",
        {
            "machine": at_start,
            "loadavg_at_end": os.getloadavg(),
            "state": {
                "params": params,
                "bytes": nbytes,
                "tensors": len(shapes) * len(GROUPS),
                "layers": layers,
                "hidden": hidden,
                "groups": {g: ("bfloat16" if d == BFLOAT16 else d.str) for g, d in GROUPS.items()},
                "bytes_per_param": sum(d.itemsize for d in GROUPS.values()),
                "block_bytes": BLOCK_BYTES,
            },
            "results": results,
            "bench_seconds": time.perf_counter() - started,
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
