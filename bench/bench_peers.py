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
  validated import against the model (``bench_adapter.py``).
Every save is made durable (fsync of its files; DCP and Cairn do it themselves) and every load
reads from the device (the files' pages are evicted first). Medians and min-max of N
interleaved reps; ratio = peer seconds / Cairn seconds (> 1: Cairn is faster).
``section`` / ``plot`` render section 2 of ``BENCHMARKS.md`` and ``results/peers.png`` from the results.
Run: ``python bench/bench_peers.py [--mib 256] [--reps 5] [--quick]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    UNSIGNED,
    MiB,
    big_state,
    drop_cache,
    interleaved,
    machine,
    measure_rss,
    state_bytes,
    stats,
    write_result,
)
from render import Targets, spread  # noqa: E402

from cairn.checkpoint import latest_committed, load_training, save_training  # noqa: E402
from cairn.state import TrainState  # noqa: E402
from cairn.stores import LocalStore  # noqa: E402

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


def fsync_tree(path: Path) -> None:
    """Make a peer's files durable, as Cairn's are (fsync every file and its directory)."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(path.parent if path.is_file() else path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    (``bench_adapter.py``); skipped, with the reason, where torch is not installed."""
    try:
        from bench_adapter import adapter_case
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


# -- section 2 of BENCHMARKS.md and its plot ------------------------------------------------------


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 2: every library's save and load; the targets against torch.save and DCP."""
    res = r["results"]
    out = [
        "## 2. Peers on the same bytes, same disk, same run",
        "",
        f"The equivalent state dict (parameters and both Adam moments, float64, {r['bytes'] / MiB:.0f} MiB; torch "
        "tensors sharing the numpy arrays' memory) saved and loaded by each library on the same local disk, "
        f"interleaved rep by rep ({r['reps']} reps). Every save is made durable (the peers' files are fsynced "
        "after `torch.save` / `save_file`; DCP and Cairn fsync themselves); every load reads from the device "
        "(pages evicted first) and touches one byte per page of what it returns (safetensors maps the file "
        "lazily). DCP runs in its non-distributed mode (one process, no process group) and loads into freshly "
        "allocated tensors. Ratio = peer seconds / Cairn seconds (> 1: Cairn is faster). Cairn's load is its "
        "full validated import (every checksum, finiteness, v ≥ 0, invariants); the peers verify no checksum "
        "and no value.",
        "",
        "| library | save | save ratio | load | load ratio | bytes on disk | peak extra RSS save / load |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, x in res.items():
        rss = x["peak_extra_rss"]
        size = f"{x['bytes_on_disk']:,}" if x.get("bytes_on_disk") else "–"
        out.append(
            f"| {name} | {spread(x['save'])} | {x['save_ratio']:.2f}× | {spread(x['load'])} | {x['load_ratio']:.2f}× | "
            f"{size} | {rss['save'] / MiB:.0f} / {rss['load'] / MiB:.0f} MiB |"
        )
    if r.get("adapter_skipped"):
        out += ["", f"Cairn PyTorch adapter save/restore: **skipped** — {r['adapter_skipped']}."]
    ts, dcp = res["torch.save / torch.load"], res["torch.distributed.checkpoint"]
    targets.add(
        "save ≥ 1.25× torch.save",
        f"{ts['save_ratio']:.2f}×",
        ts["save_ratio"] >= 1.25,
        f"by {ts['save_ratio'] / 1.25 - 1:+.0%}",
    )
    targets.add(
        "save ≥ 1.25× DCP save",
        f"{dcp['save_ratio']:.2f}×",
        dcp["save_ratio"] >= 1.25,
        f"by {dcp['save_ratio'] / 1.25 - 1:+.0%}",
    )
    targets.add(
        "load ≥ 2× DCP load",
        f"{dcp['load_ratio']:.2f}×",
        dcp["load_ratio"] >= 2.0,
        f"by {dcp['load_ratio'] / 2 - 1:+.0%}",
    )
    out += ["", "![peers](bench/results/peers.png)", ""]
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``peers.png``: save and load seconds per library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(r["results"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4))
    save = [r["results"][n]["save"]["median"] for n in names]
    load_ = [r["results"][n]["load"]["median"] for n in names]
    ax.bar(x - 0.2, save, 0.4, label="save (durable)")
    ax.bar(x + 0.2, load_, 0.4, label="load (from the device)")
    ax.set_xticks(x, [n.replace(" / ", "\n") for n in names], fontsize=8)
    ax.set_ylabel("seconds (median, lower is better)")
    ax.set_title(f"{r['bytes'] / MiB:.0f} MiB state dict: Cairn vs peers, same disk, same run")
    ax.legend()
    fig.tight_layout()
    path = folder / "peers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


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
