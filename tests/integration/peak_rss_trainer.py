"""A trainer whose FSDP engine records each rank's peak resident memory during every save and restore.

Test-only code for ``test_fsdp_memory``: the gang's rank processes import it by its factory path
(``tests.integration.peak_rss_trainer:PeakRSSMLP``, the repository root on their
``PYTHONPATH``). The trainer is the tutorial's digits MLP; its engine is the product's
``TorchFSDP``, whose ``save`` is wrapped: the resident set before it, the kernel's high-water
mark reset (``/proc/self/clear_refs``), the save, the high-water mark read back (``VmHWM``).
Its ``load`` (a restore) is weighed the same way.
``gather_at_step`` makes the save at that step hold the whole state first (every sharded
parameter and optimizer state all-gathered, as a save through a gather would): the control that
shows the measurement sees a gather.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from cairn.checkpoint.manifest import Manifest
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.distributed.checkpoint import SaveOutcome
from cairn.distributed.comm import Comm
from cairn.stores.base import Store
from cairn.trainers.base import DataParallelEngine
from cairn.trainers.pytorch.fsdp_engine import TorchFSDP
from examples.tutorial_model import DigitsMLP, MLPOptions


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakRSSOptions(MLPOptions):
    report: str
    """The folder each rank writes ``rank{R}-step{S}.json`` into, one per save."""
    gather_at_step: int | None = None
    """The save at this step holds the whole state, all-gathered, while it runs (the control)."""


class MeasuredFSDP(TorchFSDP):
    """``TorchFSDP`` whose every save is weighed (see the module)."""

    def _whole_state(self) -> list[torch.Tensor]:
        """Every sharded parameter and optimizer state, all-gathered whole (every rank calls it)."""
        trainer: Any = self.trainer
        whole = []
        with torch.no_grad():
            for p in trainer.params.values():
                whole.append(p.full_tensor())
                whole += [v.full_tensor() for v in trainer.optimizer.state.get(p, {}).values() if v.dim() > 0]
        return whole

    def save(self) -> SaveOutcome:
        assert self.state is not None
        options = self.trainer.options
        assert isinstance(options, PeakRSSOptions)
        step = self.state.step
        shard = sum(a.nbytes for a in self.state.tensors.values())
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark starts again from the current resident set
        held = self._whole_state() if step == options.gather_at_step else []
        saved = super().save()
        peak = _status_bytes("VmHWM")
        report = {
            "rank": self.comm.rank,
            "step": step,
            "rss_before": before,
            "peak": peak,
            "shard_bytes": shard,
            "gathered_bytes": sum(t.numel() * t.element_size() for t in held),
        }
        del held
        path = Path(options.report) / f"rank{self.comm.rank}-step{step}.json"
        path.write_text(json.dumps(report))
        return saved

    def load(self, ref: CheckpointRef) -> Manifest:
        """The restore, weighed as a save is: ``rank{R}-load{S}.json``."""
        options = self.trainer.options
        assert isinstance(options, PeakRSSOptions)
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        manifest = super().load(ref)
        peak = _status_bytes("VmHWM")
        assert self.state is not None
        shard = sum(a.nbytes for a in self.state.tensors.values())
        report = {"rank": self.comm.rank, "step": ref.step, "rss_before": before, "peak": peak, "shard_bytes": shard}
        (Path(options.report) / f"rank{self.comm.rank}-load{ref.step}.json").write_text(json.dumps(report))
        return manifest


class PeakRSSMLP(DigitsMLP):
    Options = PeakRSSOptions  # type: ignore[assignment]
    options: PeakRSSOptions

    def data_parallel(self, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> DataParallelEngine:
        os.makedirs(self.options.report, exist_ok=True)
        return MeasuredFSDP(self, comm, run_id, store, options)
