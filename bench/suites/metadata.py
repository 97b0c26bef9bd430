# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Proof by simulation: the metadata of a 70B-class checkpoint over 1,024 ranks, restored at 512.

The real tensor names and shapes of a Llama-3-70B-class transformer (hidden 8192, 80 layers,
64 heads / 8 KV heads, intermediate 28672, vocabulary 128256, untied embedding and head, HF
names) in five groups — bf16 weights, fp32 master weights, exp_avg, exp_avg_sq and fp32
gradients (18 bytes a parameter, 1.27 TB) — cut into 64 MiB blocks. 1,024 ranks each write
their contiguous byte-balanced share (``zero_rank``: shards declared, real BLAKE3 checksums of
zero blocks, the rank's index object written) into one ``SparseStore`` (metadata kept, data as
sizes); the coordinator commits the root (``commit_indexed``, with every check); then each of
512 new ranks plans its restore: the root read and checked once (``read_manifest(...,
expand_index=False)``) and only the indexes covering its slice (``expand``), index reads counted
by the store. Beside it: the v2 manifest of the same checkpoint (every block listed, committed
by ``commit_manifest`` and read back), the root's size for 64 ... 1,024 ranks, and 1 MiB blocks.
Rendered by ``bench.sections.metadata``.
Run: ``python -m bench.suites.metadata [--ranks 1024] [--restore 512] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import MiB, stats
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED
from cairn.checkpoint import CheckpointContent, CheckpointKind, read_manifest
from cairn.checkpoint.blocks import Block, block_elems_for, plan_blocks
from cairn.checkpoint.commit import commit_indexed, commit_manifest
from cairn.checkpoint.index import check_index_refs, expand
from cairn.checkpoint.layout import manifest_key
from cairn.checkpoint.manifest import IndexRef, Manifest, PartSpec
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import RankShards, new_save_nonce
from cairn.checkpoint.tensors import dtype_from_tag
from tests.doubles.sparse import SparseStore, zero_rank

TRAINING = CheckpointKind.TRAINING

FLOOR_GBPS = 20.0
"""The seed's example: a 2 TB checkpoint at 20 GB/s takes at least 100 s to move."""

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 8192, 80, 64, 8, 28672, 128256
KV = HIDDEN // HEADS * KV_HEADS  # 1024: grouped-query attention
GROUPS = {  # what each parameter carries in the checkpoint (18 bytes a parameter)
    "weights": "bfloat16",  # the model's bf16 weights
    "master": "<f4",  # Adam's fp32 master copy
    "exp_avg": "<f4",
    "exp_avg_sq": "<f4",
    "grads": "<f4",  # fp32 gradients (a save mid-accumulation)
}


def llama_shapes() -> dict[str, list[int]]:
    """Every parameter of the 70B-class model, by its Hugging Face name."""
    shapes = {
        "model.embed_tokens.weight": [VOCAB, HIDDEN],
        "lm_head.weight": [VOCAB, HIDDEN],
        "model.norm.weight": [HIDDEN],
    }
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": [HIDDEN, HIDDEN],
            p + "self_attn.k_proj.weight": [KV, HIDDEN],
            p + "self_attn.v_proj.weight": [KV, HIDDEN],
            p + "self_attn.o_proj.weight": [HIDDEN, HIDDEN],
            p + "mlp.gate_proj.weight": [INTERMEDIATE, HIDDEN],
            p + "mlp.up_proj.weight": [INTERMEDIATE, HIDDEN],
            p + "mlp.down_proj.weight": [HIDDEN, INTERMEDIATE],
            p + "input_layernorm.weight": [HIDDEN],
            p + "post_attention_layernorm.weight": [HIDDEN],
        }
    return shapes


def llama_parts(block_bytes: int, layers: int = LAYERS) -> dict[str, PartSpec]:
    """The blocked layout (format v3) of every group of every parameter."""
    shapes = llama_shapes()
    if layers < LAYERS:  # a quick run: fewer layers
        shapes = {n: s for n, s in shapes.items() if not n.startswith("model.layers.") or int(n.split(".")[2]) < layers}
    return {
        f"{group}/{name}": PartSpec(shape=shape, block_elems=block_elems_for(dtype, block_bytes), dtype=dtype)
        for group, dtype in GROUPS.items()
        for name, shape in shapes.items()
    }


def block_bytes_of(parts: dict[str, PartSpec], blocks: list[Block]) -> list[int]:
    item = {name: dtype_from_tag(str(spec.dtype)).itemsize for name, spec in parts.items()}
    return [b.size * item[b.tensor] for b in blocks]


def byte_shares(blocks: list[Block], sizes: list[int], world: int) -> list[list[Block]]:
    """Contiguous shares of the plan order balanced by bytes: a block goes to the rank whose
    share of the total its first byte falls in (as the data-parallel trainers split blocks)."""
    total = max(1, sum(sizes))
    out: list[list[Block]] = [[] for _ in range(world)]
    cursor = 0
    for block, size in zip(blocks, sizes, strict=True):
        out[min(world - 1, cursor * world // total)].append(block)
        cursor += size
    return out


def content() -> CheckpointContent:
    return CheckpointContent(
        kind=TRAINING,
        run_id="llama70b",
        step=100_000,
        cursor=100_000 * 1024,
        meta={"model": "llama-70b-class", "groups": GROUPS},
    )


def compact_bytes(raw: bytes) -> int:
    """The same JSON without indentation (what the root would weigh written compactly)."""
    return len(json.dumps(json.loads(raw), separators=(",", ":")).encode())


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


@contextlib.contextmanager
def own_heap() -> Iterator[None]:
    """Objects alive now (the simulated store: every rank's metadata) are left out of the
    garbage collector's scans while the block runs, as they would be in one rank's process,
    which holds only its own."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def traced(fn: Callable[[], object]) -> tuple[object, int]:
    """``fn()`` and the peak bytes Python allocated during it (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def save(parts: dict[str, PartSpec], world: int) -> dict[str, Any]:
    """Every rank's share written (one after another here; in parallel on a cluster), then the root."""
    store = SparseStore(f"sim-{world}")
    cont = content()
    t0 = time.perf_counter()
    blocks = plan_blocks(parts)
    sizes = block_bytes_of(parts, blocks)
    shares = byte_shares(blocks, sizes, world)
    plan_s = time.perf_counter() - t0
    nonce = new_save_nonce()
    refs: list[IndexRef] = []
    rank_s: list[float] = []
    with own_heap():
        for rank, share in enumerate(shares):
            t = time.perf_counter()
            refs.append(zero_rank(store, cont, parts, share, nonce=nonce, rank=rank, shard_bytes=UNSIGNED.shard_bytes))
            rank_s.append(time.perf_counter() - t)
    gathered = sum(len(r.model_dump_json()) for r in refs)  # what the all-gather of refs carries
    with own_heap():
        t = time.perf_counter()
        result = commit_indexed(store, cont, refs, nonce=nonce, parts=parts, options=UNSIGNED)
        commit_s = time.perf_counter() - t
    t = time.perf_counter()
    check_index_refs(result.manifest, UNSIGNED.limits)  # the root's structural check alone
    check_s = time.perf_counter() - t
    raw = store.read(manifest_key(result.ref.run_id, result.ref.kind, result.ref.step), 1 << 30)
    return {
        "store": store,
        "ref": result.ref,
        "refs": refs,
        "blocks": blocks,
        "sizes": sizes,
        "total_bytes": result.manifest.total_bytes,
        "plan_s": plan_s,
        "rank_s": rank_s,
        "gathered_bytes": gathered,
        "commit_s": commit_s,
        "check_refs_s": check_s,
        "root_bytes": len(raw),
        "root_compact_bytes": compact_bytes(raw),
        "root_parts_bytes": len(json.dumps(json.loads(raw)["parts"], separators=(",", ":"))),
        "metadata_written": store.written_bytes,
    }


def read_root(store: SparseStore, ref: CheckpointRef) -> Manifest:
    return read_manifest(store, ref, expect_kind=TRAINING, options=UNSIGNED, expand_index=False)


def restore_plan(sim: dict[str, Any], world: int, sample: int | None = None) -> dict[str, Any]:
    """Each new rank: ``expand`` of the shared, checked root over the blocks of its new slice."""
    store, ref = sim["store"], sim["ref"]
    root_s = []
    with own_heap():
        for _ in range(5):
            t = time.perf_counter()
            root = read_root(store, ref)
            root_s.append(time.perf_counter() - t)
    shares = byte_shares(sim["blocks"], sim["sizes"], world)
    ranks = (
        list(range(world))
        if sample is None or sample >= world
        else [round(k * (world - 1) / (sample - 1)) for k in range(sample)]
    )
    plan_s, reads, entries = [], [], []
    with own_heap():
        for rank in ranks:
            names = {b.name for b in shares[rank]}
            before = store.index_reads()
            t = time.perf_counter()
            sub = expand(store, ref, root, names)
            plan_s.append(time.perf_counter() - t)
            reads.append(store.index_reads() - before)
            entries.append(len(sub.tensors))
            assert names <= {e.name for e in sub.tensors}
            del sub
    probe = [ranks[0], ranks[len(ranks) // 2], ranks[-1]]
    mem = [traced(functools.partial(expand, store, ref, root, {b.name for b in shares[r]}))[1] for r in probe]
    _, root_mem = traced(lambda: read_root(store, ref))
    return {
        "world": world,
        "ranks_planned": len(ranks),
        "root_read": stats(root_s),
        "root_read_peak_alloc": root_mem,
        "plan": stats(plan_s) | {"samples": [], "p99": pct(plan_s, 0.99)},
        "index_reads": dict(sorted(Counter(reads).items())),
        "index_reads_max": max(reads),
        "entries_median": median(entries),
        "plan_peak_alloc": max(mem),
    }


def v2_of(sim: dict[str, Any]) -> dict[str, Any]:
    """The v2 manifest of the same checkpoint (every block entry in it), committed and read back."""
    store, ref = sim["store"], sim["ref"]
    full = expand(store, ref, read_root(store, ref))
    rank_of = {s.key: s.rank for s in full.shards}
    ranks = [RankShards(rank=r.rank, shards=[], tensors=[]) for r in sim["refs"]]
    for s in full.shards:
        ranks[s.rank].shards.append(s)
    for entry in full.tensors:
        ranks[rank_of[entry.shard]].tensors.append(entry)
    v2 = SparseStore("v2")
    parts = full.parts or {}
    result = commit_manifest(v2, content(), ranks, nonce=full.writer.nonce, parts=dict(parts), options=UNSIGNED)
    raw = v2.read(manifest_key(result.ref.run_id, result.ref.kind, result.ref.step), 1 << 30)
    read_s = []
    with own_heap():
        for _ in range(3):
            t = time.perf_counter()
            read_manifest(v2, result.ref, expect_kind=TRAINING, options=UNSIGNED)
            read_s.append(time.perf_counter() - t)
    _, mem = traced(lambda: read_manifest(v2, result.ref, expect_kind=TRAINING, options=UNSIGNED))
    entries = len(full.tensors)
    return {
        "bytes": len(raw),
        "entries": entries,
        "bytes_per_entry": len(raw) / entries,  # everything included: the estimate for other block sizes
        "read": stats(read_s),
        "read_peak_alloc": mem,
    }


def summary(sim: dict[str, Any]) -> dict[str, Any]:
    idx = [r.bytes for r in sim["refs"]]
    ents = [r.entries for r in sim["refs"]]
    return {
        "ranks": len(sim["refs"]),
        "blocks": len(sim["blocks"]),
        "total_bytes": sim["total_bytes"],
        "root_bytes": sim["root_bytes"],
        "root_compact_bytes": sim["root_compact_bytes"],
        "root_parts_bytes": sim["root_parts_bytes"],
        "index_bytes": {"median": median(idx), "max": max(idx), "min": min(idx), "total": sum(idx)},
        "index_entries": {"median": median(ents), "max": max(ents)},
        "covers": sum(len(r.covers) for r in sim["refs"]),
        "gathered_bytes": sim["gathered_bytes"],
        "metadata_written": sim["metadata_written"],
        "plan_shares_s": sim["plan_s"],
        "rank_write": stats(sim["rank_s"])
        | {"samples": [], "p99": pct(sim["rank_s"], 0.99), "sum": sum(sim["rank_s"])},
        "commit_s": sim["commit_s"],
        "check_refs_s": sim["check_refs_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument(
        "--restore", default="512,768", help="world sizes to restore-plan at (the first is the headline)"
    )
    parser.add_argument("--quick", action="store_true", help="8 layers, 64 ranks: a smoke run")
    args = parser.parse_args()
    layers = 8 if args.quick else LAYERS
    world = 64 if args.quick else args.ranks
    restores = [32] if args.quick else [int(w) for w in args.restore.split(",")]
    started = time.perf_counter()
    at_start = machine()
    parts = llama_parts(64 * MiB, layers)
    params = sum(math.prod(llama_shapes()[n.split("/", 1)[1]]) for n in parts if n.startswith("weights/"))
    sim = save(parts, world)
    headline = summary(sim)
    print(f"{world} ranks, 64 MiB blocks: {json.dumps(headline)}", flush=True)
    plans = [restore_plan(sim, w) for w in restores]
    for p in plans:
        print(f"restore at {p['world']}: {json.dumps(p)}", flush=True)
    v2 = v2_of(sim)
    print(f"v2: {json.dumps(v2)}", flush=True)
    del sim
    gc.collect()
    sweep = {}
    for w in [w for w in (64, 128, 256, 512, 1024) if w < world] + [world]:
        if w == world:
            sweep[str(w)] = {
                "root_bytes": headline["root_bytes"],
                "root_compact_bytes": headline["root_compact_bytes"],
                "index_bytes_median": headline["index_bytes"]["median"],
            }
            continue
        s = save(parts, w)
        sweep[str(w)] = {
            "root_bytes": s["root_bytes"],
            "root_compact_bytes": s["root_compact_bytes"],
            "index_bytes_median": median([r.bytes for r in s["refs"]]),
        }
        print(f"sweep {w}: {sweep[str(w)]}", flush=True)
        del s
        gc.collect()
    small = save(llama_parts(1 * MiB, layers), world)  # 1 MiB blocks: 64x the entries
    fine = summary(small) | {"restore": restore_plan(small, restores[0], sample=64)}
    print(f"1 MiB blocks: {json.dumps(fine)}", flush=True)
    del small
    gc.collect()
    seconds = time.perf_counter() - started
    write_result(
        "metadata",
        {
            "machine": at_start,
            "loadavg_at_end": os.getloadavg(),
            "model": {
                "hidden": HIDDEN,
                "layers": layers,
                "heads": HEADS,
                "kv_heads": KV_HEADS,
                "intermediate": INTERMEDIATE,
                "vocab": VOCAB,
                "params": params,
                "groups": GROUPS,
                "bytes_per_param": sum(dtype_from_tag(d).itemsize for d in GROUPS.values()),
                "tensors": len(parts),
            },
            "block_bytes": 64 * MiB,
            "save": headline,
            "restore": plans,
            "v2": v2,
            "sweep": sweep,
            "fine_blocks": fine,
            "floor_gbps": FLOOR_GBPS,
            "bench_seconds": seconds,
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
