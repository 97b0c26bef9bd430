# ruff: noqa: E501  (markdown-like sentences read better unbroken)
"""Lossless compression (``checkpoint.compression``) on trained states: compressed and raw
saves and restores against the floor of the same logical bytes, ``auto`` against ``off`` on
local disk, and the peak RSS of a compressed and a raw restore.

The states, all trained here, in this process, before anything is timed:

- ``digits_adam``: the digits CNN (``examples/digits.json`` as shipped), trained ``DIGITS_STEPS``
  updates; its training tensors (``training_tensors``: weights, AdamW's m and v, the history);
- ``lm_adam``: the LM example (``examples/lm.json``: ``ByteLM``, a byte-level GPT) made wider and
  trained ``LM_STEPS`` updates (``LM_CHANGES`` says what differs from the file); its training
  tensors, float32;
- ``lm_bf16``: the same run's weights cast to bfloat16 (``ml_dtypes``), as a mixed-precision run
  stores them.

1. S3 (SeaweedFS on loopback, started here): ``write_checkpoint`` with ``compression="zstd"`` and
   with ``"off"``, and the floor (one boto3 multipart upload of the logical bytes, with the
   store's part size and concurrency); restores: ``read_manifest`` + ``read_logical`` with the
   finite check (every stored frame's BLAKE3, the decode, every logical BLAKE3), and the floor (a
   parallel ranged download into one fresh buffer). All cases interleaved rep by rep. Also the
   same saves and restores against an in-memory store (no I/O: the codec's and the checks' CPU).
   The same S3 cases again with SeaweedFS behind a link of ``LINK_MB_S`` (its own network
   namespace, a veth pair shaped by ``tc``; needs root, else said and skipped), and through an
   in-memory store behind a simulated link of that bandwidth (a sleep per transfer). For the
   large states, the CPU seconds the client (this process) and the S3 server use in each case.
2. Local disk: a run's sequence of saves with ``auto`` and with ``off`` (each to its own store,
   interleaved save by save), the first ``WARMUP`` excluded (``auto``'s first save is raw and
   measures the store); ``last_choice`` after each ``auto`` save.
3. Peak RSS of one restore in a fresh process (compressed and raw, from S3), above the process's
   RSS after its imports, in state bytes; and again with the libraries a restore loads on first
   use (Blosc2, ml_dtypes) loaded before it, as in a worker's later restores.

Rendered by ``bench.sections.compression``.
Run: ``python -m bench.suites.compression [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.floor import ArraysReader, BufferWriter, s3_floor
from bench.harness.machine import machine
from bench.harness.measure import MiB, interleaved, peak_rss, stats
from bench.harness.results import REPO, write_result
from bench.harness.servers import (
    SERVER_PIDS,
    process_cpu_seconds,
    seaweedfs,
    seaweedfs_behind_link,
    shaped_link_unavailable,
)
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointOptions, CheckpointRef, read_manifest
from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.compression import RESAMPLE_SAVES, decide, last_choice
from cairn.checkpoint.reader import read_logical
from cairn.checkpoint.training import training_content, training_tensors
from cairn.stores.base import Store
from cairn.trainers.base import check_finite

MODES = ("zstd", "off")
STATES = ("digits_adam", "lm_adam", "lm_bf16")
DIGITS_STEPS = 300
LM_OPTIONS: dict[str, Any] = {"width": 1024, "layers": 3, "accumulation": 1, "threads": 2}
LM_BATCH = 4
LM_STEPS = 24
LM_CHANGES = (
    "width 1024 and 3 layers instead of 64 and 2, batches of 4 without accumulation instead of 16 in 4 "
    "microbatches, 2 threads, no bf16 autocast (on this CPU, without native bf16 kernels, an autocast "
    "update takes ~40x longer)"
)
QUICK_LM: dict[str, Any] = {"width": 256, "layers": 2, "accumulation": 1, "threads": 2}
LOCAL_SAVES = 25
WARMUP = 3


@dataclasses.dataclass
class TrainedState:
    name: str
    kind: CheckpointKind
    content: CheckpointContent
    tensors: dict[str, np.ndarray]
    info: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.tensors.values())

    def at(self, step: int) -> CheckpointContent:
        return dataclasses.replace(self.content, step=step)


def _config(example: str, batch: int | None, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The example's config with ``options`` over its trainer options (bf16 autocast dropped)."""
    from cairn.config import parse_config

    body = json.loads((REPO / "examples" / example).read_text())
    if batch is not None:
        body["batch_size"] = batch
    body["trainer"]["options"].update(options)
    body["trainer"]["options"].pop("autocast", None)
    return parse_config(body), body


def _train(
    name: str, example: str, batch: int | None, options: dict[str, Any], steps: int
) -> tuple[Any, dict[str, Any]]:
    from cairn.session import TrainingSession
    from cairn.stores.memory import MemoryStore

    config, body = _config(example, batch, options)
    started = time.perf_counter()
    session = TrainingSession.fresh(name, MemoryStore(name), config, options=CheckpointOptions())
    session.run(1, checkpoint_at_end=False)
    first_loss = session.state.last("loss")
    session.run(steps - 1, checkpoint_at_end=False)
    state = session.state
    info = {
        "example": f"examples/{example}",
        "options": body["trainer"]["options"],
        "batch_size": body["batch_size"],
        "steps": state.step,
        "first_loss": first_loss,
        "last_loss": state.last("loss"),
        "train_s": time.perf_counter() - started,
    }
    return state, info


def trained_states(quick: bool) -> list[TrainedState]:
    import ml_dtypes

    digits, d_info = _train("digits", "digits.json", None, {}, 50 if quick else DIGITS_STEPS)
    print(
        f"digits CNN: {d_info['steps']} updates in {d_info['train_s']:.1f} s, loss {d_info['first_loss']:.3f} -> {d_info['last_loss']:.3f}",
        flush=True,
    )
    lm_options = QUICK_LM if quick else LM_OPTIONS
    lm, l_info = _train("lm", "lm.json", LM_BATCH, lm_options, 6 if quick else LM_STEPS)
    l_info["changes"] = LM_CHANGES
    print(
        f"LM: {l_info['steps']} updates in {l_info['train_s']:.1f} s, loss {l_info['first_loss']:.3f} -> {l_info['last_loss']:.3f}",
        flush=True,
    )
    lm_tensors = training_tensors(lm)
    weights = {
        name.removeprefix("param/"): np.ascontiguousarray(a.astype(ml_dtypes.bfloat16) if a.dtype == np.float32 else a)
        for name, a in lm_tensors.items()
        if name.startswith("param/")
    }
    inference = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="lm-bf16", step=1)
    return [
        TrainedState(
            "digits_adam",
            CheckpointKind.TRAINING,
            training_content("digits-adam", digits),
            training_tensors(digits),
            d_info,
        ),
        TrainedState("lm_adam", CheckpointKind.TRAINING, training_content("lm-adam", lm), lm_tensors, l_info),
        TrainedState(
            "lm_bf16", CheckpointKind.INFERENCE, inference, weights, {**l_info, "cast": "float32 -> bfloat16"}
        ),
    ]


def save(store: Store, state: TrainedState, mode: str, step: int = 1) -> CheckpointRef:
    options = CheckpointOptions(compression=mode)
    return write_checkpoint(store, state.at(step), state.tensors, options=options).ref


def restore(store: Store, ref: CheckpointRef) -> dict[str, np.ndarray]:
    options = CheckpointOptions()
    manifest = read_manifest(store, ref, expect_kind=ref.kind, options=options)
    return read_logical(store, ref, manifest, max_workers=options.max_workers, value_check=check_finite)


def stored_bytes(store: Store, ref: CheckpointRef) -> dict[str, Any]:
    """Logical and stored bytes of a checkpoint, in all and per group of tensors (from its manifest)."""
    manifest = read_manifest(store, ref, expect_kind=ref.kind, options=CheckpointOptions())
    groups: dict[str, list[int]] = {}
    for e in manifest.tensors:
        group = (
            "Adam m"
            if e.name.endswith("/exp_avg")
            else "Adam v"
            if e.name.endswith("/exp_avg_sq")
            else "weights"
            if e.name.startswith("param/") or ref.kind == CheckpointKind.INFERENCE
            else "other"
        )
        g = groups.setdefault(group, [0, 0, 0])
        g[0] += e.length
        g[1] += e.stored_length
        g[2] += e.encoding is not None
    logical = sum(g[0] for g in groups.values())
    stored = sum(g[1] for g in groups.values())
    return {
        "logical": logical,
        "stored": stored,
        "ratio": logical / stored,
        "groups": {k: {"logical": v[0], "stored": v[1], "encoded_tensors": v[2]} for k, v in groups.items()},
    }


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def _pairs(times: dict[str, list[float]], floor: str, case: str) -> dict[str, Any]:
    f, c = stats(times[floor]), stats(times[case])
    return {
        "cairn": c,
        "ratio": f["median"] / c["median"],
        "ratio_per_rep": stats([x / y for x, y in zip(times[floor], times[case], strict=True)]),
    }


def bench_s3(states: list[TrainedState], reps: int, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every state's saves and restores, ``zstd``, ``off`` and the floor, interleaved; returns the
    results and where each state's checkpoints are (for the fresh-process restores)."""
    from cairn.stores.s3 import S3Store

    bucket = f"bench-{uuid.uuid4().hex[:6]}"
    stores = {m: S3Store(bucket, f"cairn-{m}", endpoint_url=endpoint) for m in MODES}
    stores["zstd"].ensure_bucket()
    client, tc = s3_floor(endpoint)
    by_name = {s.name: s for s in states}
    arrays = {s.name: list(s.tensors.values()) for s in states}

    def floor_up(name: str) -> None:
        client.upload_fileobj(ArraysReader(arrays[name]), bucket, f"floor-{name}.bin", Config=tc)

    def floor_down(name: str) -> np.ndarray:
        out = BufferWriter(by_name[name].nbytes)
        client.download_fileobj(bucket, f"floor-{name}.bin", out, Config=tc)
        return out.buf

    def clear(case: str) -> None:  # untimed: every save writes a fresh checkpoint
        side, _, name = case.partition(":")
        if side in stores:
            store = stores[side]
            store.delete([o.key for o in store.list(f"{by_name[name].content.run_id}/")])
        else:
            client.delete_object(Bucket=bucket, Key=f"floor-{name}.bin")

    server = SERVER_PIDS.get(endpoint)
    save_cpu: dict[str, list[tuple[float, float]]] = {}
    restore_cpu: dict[str, list[tuple[float, float]]] = {}

    def metered(
        cases: dict[str, Callable[[], object]], into: dict[str, list[tuple[float, float]]]
    ) -> dict[str, Callable[[], object]]:
        """``cases``, each recording into ``into`` the CPU seconds this process and the server
        use during it (large states only: a few hundred microseconds inside the timed call)."""

        def timed(case: str, run: Callable[[], object]) -> Callable[[], object]:
            if server is None or by_name[case.partition(":")[2]].nbytes < 16 * MiB:
                return run

            def call() -> object:
                own, theirs = time.process_time(), process_cpu_seconds(server)
                out = run()
                into.setdefault(case, []).append((time.process_time() - own, process_cpu_seconds(server) - theirs))
                return out

            return call

        return {case: timed(case, run) for case, run in cases.items()}

    save_cases: dict[str, Callable[[], object]] = {}
    for s in states:
        save_cases[f"floor:{s.name}"] = lambda n=s.name: floor_up(n)
        for m in MODES:
            save_cases[f"{m}:{s.name}"] = lambda m=m, s=s: save(stores[m], s, m)
    print(f"S3 saves: {len(save_cases)} cases x {reps} reps", flush=True)
    saves = interleaved(metered(save_cases, save_cpu), reps, before=clear)
    refs: dict[str, dict[str, CheckpointRef]] = {}
    for s in states:  # what the restores read: one checkpoint of each mode and the floor's object
        refs[s.name] = {}
        for m in MODES:
            clear(f"{m}:{s.name}")
            refs[s.name][m] = save(stores[m], s, m)
        floor_up(s.name)
    restore_cases: dict[str, Callable[[], object]] = {}
    for s in states:
        restore_cases[f"floor:{s.name}"] = lambda n=s.name: floor_down(n)
        for m in MODES:
            restore_cases[f"{m}:{s.name}"] = lambda m=m, n=s.name: restore(stores[m], refs[n][m])
    print(f"S3 restores: {len(restore_cases)} cases x {reps} reps", flush=True)
    restores = interleaved(metered(restore_cases, restore_cpu), reps, before=lambda _case: gc.collect())
    out: dict[str, Any] = {}
    for s in states:
        sizes = {m: stored_bytes(stores[m], refs[s.name][m]) for m in MODES}
        for m in MODES:  # bit for bit, whatever the encoding
            assert _same(restore(stores[m], refs[s.name][m]), s.tensors), (s.name, m)
        res: dict[str, Any] = {"bytes": s.nbytes, "tensors": len(s.tensors), "stored": sizes}
        for op, times, used in (("save", saves, save_cpu), ("restore", restores, restore_cpu)):
            res[op] = {"floor": stats(times[f"floor:{s.name}"])}
            for m in MODES:
                res[op][m] = _pairs(times, f"floor:{s.name}", f"{m}:{s.name}")
            if f"floor:{s.name}" in used:  # CPU seconds during each case, medians
                res[op]["cpu"] = {
                    side: {
                        "client": statistics.median(c for c, _ in used[f"{side}:{s.name}"]),
                        "server": statistics.median(v for _, v in used[f"{side}:{s.name}"]),
                    }
                    for side in ("floor", *MODES)
                }
        out[s.name] = res
    where = {
        "endpoint": endpoint,
        "bucket": bucket,
        "refs": {n: {m: str(r) for m, r in rr.items()} for n, rr in refs.items()},
    }
    for m in MODES:
        stores[m].close()
    return out, where


def cpu_only(states: list[TrainedState], reps: int) -> dict[str, Any]:
    """The same saves and restores into and from memory: the codec, the hashes and the checks, no I/O."""
    from cairn.stores.memory import MemoryStore

    big = [s for s in states if s.nbytes >= 16 * MiB]
    stores = {(s.name, m): MemoryStore(f"cpu-{s.name}-{m}") for s in big for m in MODES}

    def clear(case: str) -> None:
        m, _, name = case.partition(":")
        store = stores[(name, m)]
        store.delete([o.key for o in store.list("")])

    save_cases = {f"{m}:{s.name}": (lambda m=m, s=s: save(stores[(s.name, m)], s, m)) for s in big for m in MODES}
    saves = interleaved(save_cases, reps, before=clear)
    refs = {}
    for s in big:
        for m in MODES:
            clear(f"{m}:{s.name}")
            refs[(s.name, m)] = save(stores[(s.name, m)], s, m)
    restore_cases = {
        f"{m}:{s.name}": (lambda m=m, s=s: restore(stores[(s.name, m)], refs[(s.name, m)])) for s in big for m in MODES
    }
    restores = interleaved(restore_cases, reps, before=lambda _case: gc.collect())
    return {
        s.name: {
            op: {m: stats(t[f"{m}:{s.name}"]) for m in MODES} for op, t in (("save", saves), ("restore", restores))
        }
        for s in big
    }


LINK_MB_S = 100.0
"""The simulated store's bandwidth: about what SeaweedFS on loopback takes on this machine, and
a modest network store's."""


class BandwidthBound:
    """An in-memory store behind one shared link of ``mb_s``: every byte written or read
    crosses it, one transfer after another, as a delay (a sleep: no CPU), so the store's
    bandwidth, not this machine's cores, bounds a transfer — a network store whose server runs
    elsewhere. The floor and Cairn cross the same link."""

    def __init__(self, name: str, mb_s: float) -> None:
        import threading

        from cairn.stores.memory import MemoryStore

        self.inner = MemoryStore(name)
        self.url = self.inner.url
        self.read_piece_bytes = 16 << 20
        self.rate = mb_s * 1e6
        self._free_at = 0.0
        self._lock = threading.Lock()

    def _cross(self, n: int) -> None:
        with self._lock:
            start = max(time.perf_counter(), self._free_at)
            self._free_at = start + n / self.rate
            until = self._free_at
        time.sleep(max(0.0, until - time.perf_counter()))

    def write_object(self, key: str, chunks: Any, size: int | None = None) -> None:
        def paced() -> Any:
            for chunk in chunks:
                self._cross(memoryview(chunk).nbytes)
                yield chunk

        self.inner.write_object(key, paced(), size)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.inner.read_into(key, offset, out)
        self._cross(out.nbytes)

    def read_spans(self, key: str, offset: int, sizes: Any, buffer: memoryview) -> Any:
        from cairn.stores.base import Store

        return Store.read_spans(self, key, offset, sizes, buffer)  # type: ignore[arg-type]  # each span paced

    def __getattr__(self, name: str) -> Any:  # put_if_absent, read, size, list, delete, ...
        return getattr(self.inner, name)


def bench_bandwidth_bound(states: list[TrainedState], reps: int) -> dict[str, Any]:
    """Saves and restores through ``BandwidthBound`` at ``LINK_MB_S``: zstd, off and the floor
    (the raw bytes written as one object / read into one fresh buffer over the same link)."""
    big = [s for s in states if s.nbytes >= 16 * MiB]
    stores = {(s.name, m): BandwidthBound(f"link-{s.name}-{m}", LINK_MB_S) for s in big for m in (*MODES, "floor")}

    def clear(case: str) -> None:
        m, _, name = case.partition(":")
        store = stores[(name, m)]
        store.delete([o.key for o in store.list("")])

    def floor_up(s: TrainedState) -> None:
        arrays = [memoryview(a.reshape(-1).view(np.uint8)) for a in s.tensors.values()]
        stores[(s.name, "floor")].write_object("floor.bin", arrays, size=s.nbytes)

    def floor_down(s: TrainedState) -> np.ndarray:
        out = np.empty(s.nbytes, dtype=np.uint8)
        stores[(s.name, "floor")].read_into("floor.bin", 0, memoryview(out))
        return out

    save_cases: dict[str, Callable[[], object]] = {}
    for s in big:
        save_cases[f"floor:{s.name}"] = lambda s=s: floor_up(s)
        for m in MODES:
            save_cases[f"{m}:{s.name}"] = lambda m=m, s=s: save(stores[(s.name, m)], s, m)  # type: ignore[arg-type]
    saves = interleaved(save_cases, reps, before=clear)
    refs = {}
    for s in big:
        for m in MODES:
            clear(f"{m}:{s.name}")
            refs[(s.name, m)] = save(stores[(s.name, m)], s, m)  # type: ignore[arg-type]
        floor_up(s)
    restore_cases: dict[str, Callable[[], object]] = {}
    for s in big:
        restore_cases[f"floor:{s.name}"] = lambda s=s: floor_down(s)
        for m in MODES:
            restore_cases[f"{m}:{s.name}"] = lambda m=m, s=s: restore(stores[(s.name, m)], refs[(s.name, m)])  # type: ignore[arg-type]
    restores = interleaved(restore_cases, reps, before=lambda _case: gc.collect())
    out: dict[str, Any] = {"mb_s": LINK_MB_S}
    for s in big:
        for m in MODES:
            assert _same(restore(stores[(s.name, m)], refs[(s.name, m)]), s.tensors), (s.name, m)  # type: ignore[arg-type]
        res: dict[str, Any] = {"bytes": s.nbytes}
        for op, times in (("save", saves), ("restore", restores)):
            res[op] = {"floor": stats(times[f"floor:{s.name}"])}
            for m in MODES:
                res[op][m] = _pairs(times, f"floor:{s.name}", f"{m}:{s.name}")
        out[s.name] = res
    return out


def bench_local(states: list[TrainedState], saves: int, warmup: int, workdir: Path) -> dict[str, Any]:
    """A run's sequence of saves, ``auto`` and ``off`` each to its own store, interleaved save by save."""
    from cairn.stores import LocalStore

    big = [s for s in states if s.nbytes >= 16 * MiB]
    stores = {(s.name, m): LocalStore(workdir / f"{s.name}-{m}") for s in big for m in ("auto", "off")}
    step = {key: 0 for key in stores}
    choices: dict[str, list[dict[str, Any]]] = {s.name: [] for s in big}

    def previous_gone(case: str) -> None:  # untimed: the run keeps one checkpoint; every save is new
        m, _, name = case.partition(":")
        store = stores[(name, m)]
        store.delete([o.key for o in store.list("")])
        os.sync()

    def one(name: str, mode: str) -> None:
        key = (name, mode)
        step[key] += 1
        state = next(s for s in big if s.name == name)
        save(stores[key], state, mode, step[key])
        if mode == "auto":
            choice = last_choice(stores[key].url)
            assert choice is not None
            choices[name].append({"save": step[key], **choice.model_dump()})

    # Paired: each state's auto and off saves one after the other, which goes first alternating
    # every rep, so that each follows the other as often (what the disk did just before — a
    # large write, a delete — weighs on both alike).
    times: dict[str, list[float]] = {f"{m}:{s.name}": [] for s in big for m in ("auto", "off")}
    for rep in range(saves):
        for s in big:
            for m in ("auto", "off") if rep % 2 == 0 else ("off", "auto"):
                case = f"{m}:{s.name}"
                previous_gone(case)
                started = time.perf_counter()
                one(s.name, m)
                times[case].append(time.perf_counter() - started)
    out: dict[str, Any] = {}
    for s in big:
        auto, off = times[f"auto:{s.name}"][warmup:], times[f"off:{s.name}"][warmup:]
        # auto's own work, apart from the disk's noise: the decision as a save makes it, over
        # enough saves to include its periodic codec samples (their mean is the cost per save).
        own = []
        for _ in range(4 * (RESAMPLE_SAVES + 1)):
            started = time.perf_counter()
            decide("auto", stores[(s.name, "auto")].url, s.tensors)
            own.append(time.perf_counter() - started)
        quartiles = statistics.quantiles(off, n=4)
        out[s.name] = {
            "bytes": s.nbytes,
            "auto": stats(auto),
            "off": stats(off),
            "warmup_auto": times[f"auto:{s.name}"][:warmup],
            "warmup_off": times[f"off:{s.name}"][:warmup],
            "ratio": stats(off)["median"] / stats(auto)["median"],
            "ratio_per_rep": stats([o / a for o, a in zip(off, auto, strict=True)]),
            "own_seconds_per_save": statistics.fmean(own),
            "own_seconds_max": max(own),
            "own_decisions": len(own),
            "resample_saves": RESAMPLE_SAVES,
            "off_interquartile": [quartiles[0], quartiles[2]],
            "choices": choices[s.name],
        }
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_high_water() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _high_water() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(endpoint: str, bucket: str, ref_text: str, libraries_first: bool = False) -> dict[str, int]:
    """One restore in this (fresh) process: RSS after imports, and at the restore's peak (sampled
    every 2 ms and the kernel's high-water mark, reset just before it). ``libraries_first``: the
    libraries a restore loads on first use (Blosc2, ml_dtypes) are loaded before, as in a worker
    that restored before; what they add is recorded as ``libraries``."""
    from cairn.stores.s3 import S3Store

    ref = CheckpointRef.parse(ref_text)
    prefix = ref.store_url.removeprefix(f"s3://{bucket}").strip("/")
    store = S3Store(bucket, prefix, endpoint_url=endpoint)
    before_libraries = _rss()
    if libraries_first:
        from cairn.checkpoint import codec, tensors

        codec.warm_up()
        tensors.dtype_from_tag(tensors.BFLOAT16_TAG)
    after_imports = _rss()
    _reset_high_water()
    with peak_rss() as sampled:
        arrays = restore(store, ref)
    peak = max(after_imports + sampled["peak_extra"], _high_water())
    return {
        "after_imports": after_imports,
        "libraries": after_imports - before_libraries,
        "peak": peak,
        "state_bytes": sum(a.nbytes for a in arrays.values()),
    }


def fresh_process_rss(where: dict[str, Any], state: str, mode: str, libraries_first: bool = False) -> dict[str, Any]:
    request = {"endpoint": where["endpoint"], "bucket": where["bucket"], "ref": where["refs"][state][mode]}
    argv = [sys.executable, "-m", "bench.suites.compression", "--child", json.dumps(request)]
    argv += ["--libraries-first"] if libraries_first else []
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO, timeout=600)
    r: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    r["peak_over_imports"] = r["peak"] - r["after_imports"]
    r["ratio_to_state"] = r["peak_over_imports"] / r["state_bytes"]
    return r


def report(s3: dict[str, Any], local: dict[str, Any]) -> None:
    for name, r in s3.items():
        mb = r["bytes"] / 1e6
        print(f"{name}: {mb:.1f} MB, stored {r['stored']['zstd']['ratio']:.3f}x smaller with zstd", flush=True)
        for op in ("save", "restore"):
            f = r[op]["floor"]["median"]
            line = f"  S3 {op:<8} floor {f:.3f}s {mb / f:6.0f} MB/s"
            for m in MODES:
                c = r[op][m]["cairn"]["median"]
                line += f"  {m} {c:.3f}s ({r[op][m]['ratio']:.2f}x)"
            print(line, flush=True)
    for name, r in local.items():
        last = r["choices"][-1]
        print(
            f"{name}: local saves auto {r['auto']['median']:.3f}s off {r['off']['median']:.3f}s "
            f"ratio {r['ratio']:.3f}x; auto compress={last['compress']} ({last['why']})",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small LM, 3 reps: a smoke run")
    parser.add_argument("--child", type=json.loads, help=argparse.SUPPRESS)
    parser.add_argument("--libraries-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        c = args.child
        print(json.dumps(child(c["endpoint"], c["bucket"], c["ref"], args.libraries_first)))
        return 0
    started = time.perf_counter()
    started_on = machine()  # the load average when the run starts
    reps = 3 if args.quick else args.reps
    saves, warmup = (5, 2) if args.quick else (LOCAL_SAVES, WARMUP)
    states = trained_states(args.quick)
    trained_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="cairn-bench-compression-") as tmp:
        with seaweedfs(Path(tmp) / "s3") as endpoint:
            s3, where = bench_s3(states, reps, endpoint)
            rss: dict[str, Any] = {}
            for s in states:
                if s.nbytes >= 16 * MiB:
                    rss[s.name] = {m: fresh_process_rss(where, s.name, m) for m in MODES}
                    for m in MODES:
                        rss[s.name][m]["libraries_first"] = fresh_process_rss(where, s.name, m, libraries_first=True)
        s3_link: dict[str, Any] = {"mb_s": LINK_MB_S}
        why = shaped_link_unavailable()
        if why is None:
            with seaweedfs_behind_link(Path(tmp) / "s3-link", LINK_MB_S) as endpoint:
                print(f"S3 behind a {LINK_MB_S:.0f} MB/s link at {endpoint}", flush=True)
                s3_link["states"], _ = bench_s3([s for s in states if s.nbytes >= 16 * MiB], reps, endpoint)
        else:
            s3_link["unavailable"] = why
            print(f"S3 behind a link: not measured: {why}", flush=True)
        memory = cpu_only(states, reps)
        link = bench_bandwidth_bound(states, reps)
        local_dir = Path(tmp) / "local"
        local_dir.mkdir()
        local = bench_local(states, saves, warmup, local_dir)
    report(s3, local)
    for name, x in link.items():
        if name != "mb_s":
            print(
                f"{name}: through a {LINK_MB_S:.0f} MB/s link: save zstd {x['save']['zstd']['ratio']:.2f}x off "
                f"{x['save']['off']['ratio']:.2f}x, restore zstd {x['restore']['zstd']['ratio']:.2f}x off "
                f"{x['restore']['off']['ratio']:.2f}x the floor",
                flush=True,
            )
    payload = {
        "machine": started_on,
        "reps": reps,
        "local_saves": saves,
        "local_order": "paired",
        "warmup": warmup,
        "states": {s.name: {"bytes": s.nbytes, "tensors": len(s.tensors), **s.info} for s in states},
        "s3": s3,
        "memory": memory,
        "bandwidth_bound": link,
        "s3_link": s3_link,
        "local": local,
        "rss": rss,
        "seconds": {"training": trained_s, "total": time.perf_counter() - started},
    }
    write_result("compression", payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
