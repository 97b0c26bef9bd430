# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Checkpoints from GPU memory (needs CUDA; ``make gpu-check``): a training state on the device —
float32 parameters of a stack of linear layers and AdamW's two moments after one step — saved
to local disk and restored onto the device by:

- Cairn: the adapter's export path (``HostStaging``: every tensor copied into its reused pinned
  host buffer, one synchronisation) + ``write_checkpoint`` (BLAKE3 of every byte, commit);
  restore by ``read_logical`` (every checksum, every value finite) + copies onto the device;
- ``torch.save`` of the GPU state dict / ``torch.load(map_location="cuda", weights_only=True)``;
- DCP ``save`` of the GPU state dict / ``load`` into GPU tensors (single process).

Every save is fsync'd; restores read from the device (pages evicted). Median (min-max) of N
interleaved reps; ratio = peer seconds / Cairn seconds. Also: the staging copy alone (device ->
pinned host) and its GB/s. Writes ``bench/results/gpu.json``; rendered by ``bench.sections.gpu``.
Run: ``python -m bench.suites.gpu [--gib 1] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.floor import fsync_tree
from bench.harness.machine import machine
from bench.harness.measure import drop_cache, interleaved, stats
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED
from cairn.checkpoint import CheckpointContent, CheckpointKind, read_manifest
from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.reader import read_logical
from cairn.stores import LocalStore
from cairn.trainers.base import check_finite
from cairn.trainers.pytorch.device import HostStaging
from cairn.trainers.pytorch.state_io import from_numpy


def gpu_state(gib: float) -> dict[str, Any]:
    """Parameters + AdamW moments on the GPU, ``gib`` GiB in all (a third each)."""
    import torch

    width = 4096
    layers = max(1, int(gib * 2**30 / 3 / (width * width * 4)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers))).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, width, device="cuda")).sum().backward()
    opt.step()
    sd: dict[str, Any] = {f"param/{n}": p.detach() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            sd[f"optim/{n}/{key}"] = opt.state[p][key]
    torch.cuda.synchronize()
    return sd


def main() -> int:
    import torch
    import torch.distributed.checkpoint as dcp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench.suites.gpu: no CUDA device here: nothing measured", file=sys.stderr)
        return 2
    sd = gpu_state(args.gib)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-gpu-"))
    staging = HostStaging(pin=True)
    store = LocalStore(work / "cairn")
    refs: list[Any] = []
    pt, dcp_dir = work / "state.pt", work / "dcp"

    def stage() -> dict[str, Any]:
        arrays = {n: staging.stage(n, t) for n, t in sd.items()}
        staging.wait()
        return arrays

    def cairn_save() -> None:
        content = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="gpu", step=len(refs) + 1)
        refs.append(write_checkpoint(store, content, stage(), options=UNSIGNED).ref)

    def cairn_load() -> None:
        ref = refs[-1]
        manifest = read_manifest(store, ref, expect_kind=CheckpointKind.INFERENCE, options=UNSIGNED)
        arrays = read_logical(store, ref, manifest, max_workers=UNSIGNED.max_workers, value_check=check_finite)
        on_device = {n: from_numpy(a).to("cuda", non_blocking=False) for n, a in arrays.items()}
        torch.cuda.synchronize()
        assert len(on_device) == len(sd)

    def torch_save() -> None:
        torch.save(sd, pt)
        fsync_tree(pt)

    def torch_load() -> None:
        torch.load(pt, map_location="cuda", weights_only=True)
        torch.cuda.synchronize()

    def dcp_save() -> None:
        shutil.rmtree(dcp_dir, ignore_errors=True)
        dcp.save(sd, checkpoint_id=dcp_dir)

    def dcp_load() -> None:
        target = {k: torch.empty_like(v) for k, v in sd.items()}
        dcp.load(target, checkpoint_id=dcp_dir)
        torch.cuda.synchronize()

    try:
        stage()  # allocate the pinned buffers once, as a run's first export does
        start = time.perf_counter()
        stage()
        staging_seconds = time.perf_counter() - start
        saves = interleaved({"cairn": cairn_save, "torch.save": torch_save, "dcp": dcp_save}, args.reps)
        loads = interleaved(
            {"cairn": cairn_load, "torch.save": torch_load, "dcp": dcp_load}, args.reps, lambda _n: drop_cache(work)
        )
        write_result(
            "gpu",
            {
                "machine": {**machine(), "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda},
                "reps": args.reps,
                "bytes": nbytes,
                "staging_seconds": staging_seconds,
                "save": {k: stats(v) for k, v in saves.items()},
                "restore": {k: stats(v) for k, v in loads.items()},
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
