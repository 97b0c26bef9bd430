"""Cairn next to its peers on the same bytes, the same disk, in the same run.

The equivalent state dict (parameters and both Adam moments, float64, as torch tensors that
share the numpy arrays' memory) saved and loaded by:
- ``torch.save`` / ``torch.load(weights_only=True)``;
- ``torch.distributed.checkpoint`` (DCP) ``save`` / ``load`` — single process, no process group
  (DCP's non-distributed mode); load fills freshly allocated tensors, as DCP requires;
- safetensors ``save_file`` / ``load_file``;
- Cairn ``save_training`` / ``load_training`` (every byte hashed on save; full validation on load);
- the Cairn PyTorch adapter (``cairn.trainers.pytorch``): a module with the same parameters and
  Adam state, saved through the adapter (zero-copy views of the live tensors) and restored by a
  validated import against the model (``bench.harness.adapter``).
Every save is made durable (fsync of its files; DCP and Cairn do it themselves) and every load
reads from the device (the files' pages are evicted first). Medians and min-max of N
interleaved reps; ratio = peer seconds / Cairn seconds (> 1: Cairn is faster).
Rendered by ``bench.sections.peers``.
Run: ``python -m bench.suites.peers [--mib 256] [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.floor import fsync_tree
from bench.harness.machine import machine
from bench.harness.measure import drop_cache, interleaved, measure_rss, stats
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED, big_state, state_bytes
from cairn.checkpoint import latest_committed
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.training import load_training, save_training

Case = tuple[Callable[[], object], Callable[[], object]]
"""(save, load) of one library."""


def touched(tensors: dict[str, Any]) -> dict[str, Any]:
    """Read one byte of every page of every loaded tensor, so that a loader that maps the file
    lazily (safetensors) is timed for really reading it, like the others."""
    for t in tensors.values():
        flat = t.reshape(-1).view(dtype=t.dtype) if hasattr(t, "numpy") else t.reshape(-1)
        raw = flat.view(__import__("torch").uint8) if hasattr(t, "numpy") else flat.view("u1")
        int(raw[::4096].sum())
    return tensors


def torch_state_dict(state: TrainState) -> dict[str, Any]:
    import torch

    sd: dict[str, Any] = {}
    for name in state.params:
        sd[f"model.{name}"] = torch.from_numpy(state.params[name])
        sd[f"optim.exp_avg.{name}"] = torch.from_numpy(state.m[name])
        sd[f"optim.exp_avg_sq.{name}"] = torch.from_numpy(state.v[name])
    return sd


def peer_cases(state: TrainState, work: Path) -> dict[str, Case]:
    import safetensors.torch
    import torch
    import torch.distributed.checkpoint as dcp

    sd = torch_state_dict(state)
    pt, st, dcp_dir = work / "state.pt", work / "state.safetensors", work / "dcp"

    def torch_save() -> None:
        torch.save(sd, pt)
        fsync_tree(pt)

    def safetensors_save() -> None:
        safetensors.torch.save_file(sd, st)
        fsync_tree(st)

    def dcp_save() -> None:
        shutil.rmtree(dcp_dir, ignore_errors=True)
        dcp.save(sd, checkpoint_id=dcp_dir)  # FileSystemWriter fsyncs its files

    def dcp_load() -> dict[str, Any]:
        target = {k: torch.empty_like(v) for k, v in sd.items()}
        dcp.load(target, checkpoint_id=dcp_dir)
        return target

    return {
        "torch.save / torch.load": (torch_save, lambda: touched(torch.load(pt, weights_only=True))),
        "torch.distributed.checkpoint": (dcp_save, lambda: touched(dcp_load())),
        "safetensors": (safetensors_save, lambda: touched(safetensors.torch.load_file(st))),
    }


def adapter_cases(state: TrainState, work: Path) -> tuple[dict[str, Case], str | None]:
    """The Cairn PyTorch adapter's own save/restore of the same parameters and Adam moments
    (``bench.harness.adapter``); skipped, with the reason, where torch is not installed."""
    try:
        from bench.harness.adapter import adapter_case

    except ImportError as exc:
        return {}, f"the PyTorch adapter does not import ({exc})"
    return {"cairn PyTorch adapter": adapter_case(state, work, UNSIGNED)}, None


def cairn_case(state: TrainState, work: Path) -> Case:
    store = LocalStore(work / "cairn")

    def save() -> None:
        store.delete([o.key for o in store.list("")])
        save_training(store, "peers", state, options=UNSIGNED)

    def load() -> object:
        ref = latest_committed(store, "peers")
        assert ref is not None
        state, _ = load_training(store, ref, options=UNSIGNED)
        return touched(
            {**state.params, **{f"m.{k}": a for k, a in state.m.items()}, **{f"v.{k}": a for k, a in state.v.items()}}
        )

    return save, load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 3 reps: a smoke run")
    args = parser.parse_args()
    mib, reps = (16, 3) if args.quick else (args.mib, args.reps)
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialized
    state = big_state(mib)
    with tempfile.TemporaryDirectory(prefix="cairn-bench-peers-") as tmp:
        work = Path(tmp)
        cases: dict[str, Case] = {"cairn": cairn_case(state, work)}
        cases.update(peer_cases(state, work))
        adapter, skipped = adapter_cases(state, work)
        cases.update(adapter)
        if skipped:
            print(f"SKIPPED Cairn PyTorch adapter save/restore: {skipped}")

        def settle(_name: str) -> None:
            gc.collect()
            os.sync()

        saves = interleaved({n: c[0] for n, c in cases.items()}, reps, before=settle)
        loads = interleaved(
            {n: c[1] for n, c in cases.items()}, reps, before=lambda _n: (gc.collect(), drop_cache(work))
        )
        rss: dict[str, dict[str, int]] = {}
        for name, (save, load) in cases.items():
            drop_cache(work)
            rss[name] = {"save": measure_rss(save)}
            drop_cache(work)
            rss[name]["load"] = measure_rss(load)
        sizes = {
            "torch.save / torch.load": (work / "state.pt").stat().st_size,
            "safetensors": (work / "state.safetensors").stat().st_size,
            "torch.distributed.checkpoint": sum(p.stat().st_size for p in (work / "dcp").rglob("*") if p.is_file()),
            "cairn": sum(p.stat().st_size for p in (work / "cairn").rglob("*") if p.is_file()),
            "cairn PyTorch adapter": sum(p.stat().st_size for p in (work / "adapter").rglob("*") if p.is_file()),
        }
    results: dict[str, Any] = {}
    ours = {"save": stats(saves["cairn"])["median"], "load": stats(loads["cairn"])["median"]}
    for name in cases:
        results[name] = {
            "save": stats(saves[name]),
            "load": stats(loads[name]),
            "save_ratio": stats(saves[name])["median"] / ours["save"],
            "load_ratio": stats(loads[name])["median"] / ours["load"],
            "peak_extra_rss": rss[name],
            "bytes_on_disk": sizes.get(name),
        }
        r = results[name]
        print(
            f"{name:<30} save {r['save']['median']:7.3f}s ({r['save_ratio']:.2f}x cairn)"
            f"  load {r['load']['median']:7.3f}s ({r['load_ratio']:.2f}x cairn)"
            f"  rss save {rss[name]['save'] / 2**20:5.0f} MiB load {rss[name]['load'] / 2**20:5.0f} MiB",
            flush=True,
        )
    write_result(
        "peers",
        {
            "machine": machine(),
            "reps": reps,
            "bytes": state_bytes(state),
            "results": results,
            "adapter_skipped": skipped,
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
