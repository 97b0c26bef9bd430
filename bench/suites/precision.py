# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Checkpoints of a small GPT's weights in bfloat16 vs float32, against the disk floor of their bytes.

The state: the tensors of a GPT-2-style model of about 50M parameters (token and position
embeddings, per layer the attention's fused QKV and output projections, the MLP's two
projections, their biases and two LayerNorms; the head tied to the token embedding), built with
numpy — bfloat16 (``ml_dtypes``, stored natively at 2 bytes an element) and float32. Ours:
``write_checkpoint`` (BLAKE3 of every byte, shards, manifest commit) and ``read_manifest`` +
``read_logical`` with the finite check on every value (what ``load_training`` runs, minus a
trainer's metadata rules). Floor: the same bytes by plain sequential I/O, as ``bench.suites.store``
measures it (one file written + fsync / read into one fresh buffer); restores read from the
device (every file's pages evicted first, both sides). All four cases (floor and Cairn, each
precision) interleaved rep by rep.

Reports per precision and op: median and min-max seconds, MB/s, ratio = floor seconds / our
seconds; and the peak RSS of one save and one restore, each in a fresh process, above that
process's RSS after its imports, vs the state's bytes (a save's includes the model itself,
built before it; a restore's the restored state).
Rendered by ``bench.sections.precision``.
Run: ``python -m bench.suites.precision [--reps 7] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.floor import floor_read_file, floor_write_file
from bench.harness.machine import machine
from bench.harness.measure import MiB, drop_cache, interleaved, peak_rss, stats
from bench.harness.results import REPO, write_result
from bench.harness.states import UNSIGNED
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointRef, read_manifest
from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.reader import read_logical
from cairn.checkpoint.tensors import CHECK_CHUNK, dtype_from_tag, dtype_tag, tensor_checksum
from cairn.stores import LocalStore
from cairn.trainers.base import check_finite

PRECISIONS = {"bf16": "bfloat16", "fp32": "<f4"}
"""Case name -> the manifest's dtype tag."""
GPT = {"layers": 10, "d_model": 512, "vocab": 32000, "context": 1024}
QUICK_GPT = {"layers": 2, "d_model": 256, "vocab": 8000, "context": 256}
KIND = CheckpointKind.INFERENCE


def gpt_shapes(layers: int, d_model: int, vocab: int, context: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a GPT-2-style model (the head tied to ``wte``)."""
    d = d_model
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (vocab, d), "wpe.weight": (context, d)}
    for i in range(layers):
        p = f"h.{i:02d}."
        shapes |= {
            p + "ln_1.weight": (d,),
            p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d),
            p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d),
            p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,),
            p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, 4 * d),
            p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (4 * d, d),
            p + "mlp.c_proj.bias": (d,),
        }
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,)}


def gpt_state(shapes: dict[str, tuple[int, ...]], tag: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights ~ N(0, 0.02), LayerNorm weights 1 and biases 0, in the dtype ``tag`` names; drawn
    1 Mi elements at a time, so building it never holds more than the state and one small chunk."""
    dtype = dtype_from_tag(tag)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        arr = np.empty(shape, dtype=dtype)
        flat = arr.reshape(-1)
        if ".ln_" in name or name.startswith("ln_f"):
            flat[...] = 1.0 if name.endswith("weight") else 0.0
        else:
            for start in range(0, flat.size, 1 << 20):
                chunk = rng.standard_normal(min(1 << 20, flat.size - start), dtype=np.float32) * np.float32(0.02)
                flat[start : start + chunk.size] = chunk.astype(dtype)
        out[name] = arr
    return out


def save(store: LocalStore, arrays: dict[str, np.ndarray], run_id: str) -> CheckpointRef:
    return write_checkpoint(store, CheckpointContent(kind=KIND, run_id=run_id, step=1), arrays, options=UNSIGNED).ref


def restore(store: LocalStore, ref: CheckpointRef) -> dict[str, np.ndarray]:
    manifest = read_manifest(store, ref, expect_kind=KIND, options=UNSIGNED)
    return read_logical(store, ref, manifest, max_workers=UNSIGNED.max_workers, value_check=check_finite)


def cpu_work(arrays: dict[str, np.ndarray]) -> dict[str, float]:
    """The restore's CPU work alone, in memory: BLAKE3 of every byte, and the finite check in
    the reader's chunks."""
    times = interleaved(
        {
            "blake3": lambda: [tensor_checksum(a) for a in arrays.values()],
            "finite": lambda: [
                check_finite(n, flat[i : i + CHECK_CHUNK // flat.itemsize])
                for n, a in arrays.items()
                for flat in [a.reshape(-1)]
                for i in range(0, flat.size, CHECK_CHUNK // flat.itemsize)
            ],
        },
        5,
    )
    return {name: stats(t)["median"] for name, t in times.items()}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_high_water() -> None:
    """Start ``VmHWM`` again from the current RSS (Linux >= 4.0), so that the peak read after a
    call is the call's, not that of building the model before it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _high_water() -> int:
    """The process's peak RSS since the reset (``VmHWM``: this image's own, unlike
    ``ru_maxrss``, which carries the parent's over fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(op: str, precision: str, folder: Path, model: dict[str, int]) -> dict[str, int]:
    """One save or one restore in this (fresh) process: its RSS after imports, before the call
    and at the call's peak (sampled every 2 ms, and the kernel's high-water mark, reset just
    before the call)."""
    store = LocalStore(folder)
    after_imports = _rss()
    shapes = gpt_shapes(**model)
    if op == "save":
        arrays = gpt_state(shapes, PRECISIONS[precision])
        _reset_high_water()
        before = _rss()
        with peak_rss() as sampled:
            save(store, arrays, precision)
    else:
        _reset_high_water()
        before = _rss()
        with peak_rss() as sampled:
            arrays = restore(store, CheckpointRef(store.url, precision, KIND, 1))
    high_water = _high_water()
    peak = max(before + sampled["peak_extra"], high_water)
    return {
        "after_imports": after_imports,
        "before": before,
        "peak": peak,
        "state_bytes": sum(a.nbytes for a in arrays.values()),
    }


def fresh_process_rss(op: str, precision: str, folder: Path, model: dict[str, int]) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.suites.precision",
        "--child",
        op,
        "--precision",
        precision,
        "--folder",
        str(folder),
        "--model",
        json.dumps(model),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO, timeout=600)
    r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    r["peak_over_imports"] = r["peak"] - r["after_imports"]
    r["ratio_to_state"] = r["peak_over_imports"] / r["state_bytes"]
    return r


def bench(model: dict[str, int], reps: int, workdir: Path) -> dict[str, Any]:
    shapes = gpt_shapes(**model)
    states = {p: gpt_state(shapes, tag) for p, tag in PRECISIONS.items()}
    nbytes = {p: sum(a.nbytes for a in s.values()) for p, s in states.items()}
    stores = {p: LocalStore(workdir / p) for p in PRECISIONS}
    floors = {p: workdir / f"floor-{p}.bin" for p in PRECISIONS}

    def fresh_files(name: str) -> None:  # every save writes new files
        p = name.rpartition("_")[2]
        floors[p].unlink(missing_ok=True)
        stores[p].delete([o.key for o in stores[p].list(f"{p}/")])
        os.sync()

    save_cases: dict[str, Any] = {}
    for p in PRECISIONS:
        save_cases[f"floor_{p}"] = lambda p=p: floor_write_file(list(states[p].values()), floors[p])
        save_cases[f"cairn_{p}"] = lambda p=p: save(stores[p], states[p], p)
    saves = interleaved(save_cases, reps, before=fresh_files)
    refs = {}
    for p in PRECISIONS:  # the checkpoints and floor files the restores read
        fresh_files(f"_{p}")
        floor_write_file(list(states[p].values()), floors[p])
        refs[p] = save(stores[p], states[p], p)
    restore_cases: dict[str, Any] = {}
    for p in PRECISIONS:
        restore_cases[f"floor_{p}"] = lambda p=p: floor_read_file(floors[p], nbytes[p])
        restore_cases[f"cairn_{p}"] = lambda p=p: restore(stores[p], refs[p])
    restores = interleaved(restore_cases, reps, before=lambda _name: (gc.collect(), drop_cache(workdir)))
    for p in PRECISIONS:  # bit for bit, natively 2 (or 4) bytes an element
        back = restore(stores[p], refs[p])
        assert all(
            back[k].tobytes() == states[p][k].tobytes() and dtype_tag(back[k].dtype) == PRECISIONS[p] for k in shapes
        )
        assert sum(o.size for o in stores[p].list(f"{p}/") if o.key.endswith(".bin")) == nbytes[p]
    del back
    out: dict[str, Any] = {}
    for p in PRECISIONS:
        res: dict[str, Any] = {"bytes": nbytes[p], "dtype": PRECISIONS[p], "cpu_s": cpu_work(states[p])}
        for op, times in (("save", saves), ("restore", restores)):
            floor, ours = times[f"floor_{p}"], times[f"cairn_{p}"]
            res[op] = {
                "floor": stats(floor),
                "cairn": stats(ours),
                "ratio": stats(floor)["median"] / stats(ours)["median"],
                "ratio_per_rep": stats([f / o for f, o in zip(floor, ours, strict=True)]),
            }
        out[p] = res
    states.clear()  # the parent holds no state while the fresh processes measure theirs
    gc.collect()
    for p in PRECISIONS:  # each in a fresh process: the save into a new store, the restore of refs[p]
        drop_cache(workdir)
        out[p]["restore"]["rss"] = fresh_process_rss("restore", p, workdir / p, model)
        out[p]["save"]["rss"] = fresh_process_rss("save", p, workdir / f"rss-{p}", model)
    return out


def report(p: str, r: dict[str, Any]) -> None:
    for op in ("save", "restore"):
        f, o, rss = r[op]["floor"], r[op]["cairn"], r[op]["rss"]
        mb = r["bytes"] / 1e6
        print(
            f"{p} {mb:6.0f} MB {op:<8} floor {f['median']:6.3f}s {mb / f['median']:6.0f} MB/s  cairn {o['median']:6.3f}s "
            f"{mb / o['median']:6.0f} MB/s  ratio {r[op]['ratio']:.2f}x  fresh-process peak RSS "
            f"{rss['peak_over_imports'] / MiB:.0f} MiB = {rss['ratio_to_state']:.2f}x state",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="a 2-layer model, 3 reps: a smoke run")
    parser.add_argument("--child", choices=["save", "restore"], help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.precision, args.folder, args.model)))
        return 0
    model = QUICK_GPT if args.quick else GPT
    reps = 3 if args.quick else args.reps
    shapes = gpt_shapes(**model)
    params = sum(int(np.prod(s)) for s in shapes.values())
    print(f"GPT {model}: {params / 1e6:.1f}M parameters in {len(shapes)} tensors", flush=True)
    started_on = machine()  # the load average when the run starts
    with tempfile.TemporaryDirectory(prefix="cairn-bench-precision-") as tmp:
        results = bench(model, reps, Path(tmp))
    for p, r in results.items():
        report(p, r)
    payload = {
        "machine": started_on,
        "reps": reps,
        "model": {**model, "params": params, "tensors": len(shapes)},
        "results": results,
    }
    write_result("precision", payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
