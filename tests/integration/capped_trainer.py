"""A Hugging Face causal LM whose rank processes may not allocate more than a fixed budget.

Test-only code for ``test_fsdp_outgrows_a_rank``: the gang's rank processes import it by its
factory path (``tests.integration.capped_trainer:CappedCausalLM``, the repository root on their
``PYTHONPATH``). When the trainer is built in a rank process (``RANK`` set by torchrun), before
its model exists, it lowers the process's ``RLIMIT_DATA`` (the kernel's limit on private writable
memory: heap and anonymous mappings, whether touched or not) to what the process holds then plus
``rank_data_budget`` bytes. An allocation past it fails (``DefaultCPUAllocator: not enough
memory``): the cap a device's memory puts on a rank, here on the CPU. Elsewhere (the worker,
``ckpt`` tools) nothing is capped.
"""

from __future__ import annotations

import os
import resource

from cairn.config import TrainConfig
from cairn.trainers.hf import HFCausalLM, HFOptions


def vm_data() -> int:
    """What ``RLIMIT_DATA`` counts for this process now (``VmData``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


class CappedOptions(HFOptions):
    rank_data_budget: int
    """Bytes a rank process may allocate beyond what it holds when its trainer is built."""


class CappedCausalLM(HFCausalLM):
    """``HFCausalLM`` under a per-rank memory cap (see the module)."""

    Options = CappedOptions
    options: CappedOptions

    def __init__(self, config: TrainConfig, options: CappedOptions) -> None:  # type: ignore[override]
        if "RANK" in os.environ:
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            cap = vm_data() + options.rank_data_budget
            resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
            print(f"rank {os.environ['RANK']}: RLIMIT_DATA {cap >> 20} MiB", flush=True)
        super().__init__(config, options)
