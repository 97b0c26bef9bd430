"""A Hugging Face causal LM whose rank processes may not use more than a fixed budget.

Test-only code for ``test_fsdp_outgrows_a_rank``: the gang's rank processes import it by its
factory path (``tests.integration.capped_trainer:CappedCausalLM``, the repository root on their
``PYTHONPATH``). When the trainer is built in a rank process (``RANK`` set by torchrun), before
its model exists, it caps what the process may take from then on, in one of two ways:

- ``rank_data_budget``: the process's ``RLIMIT_DATA`` (the kernel's limit on private writable
  memory: heap and anonymous mappings, whether touched or not) becomes what it holds then plus
  the budget. An allocation past it fails (``DefaultCPUAllocator: not enough memory``).
- ``rank_memory_budget``: the process moves into a memory cgroup of its own (cgroup v1, a child
  of the one it runs in) whose limit is the budget. Pages already resident stay charged where
  they were; every page it touches from then on counts, and past the limit (once the kernel has
  dropped what it can of the page cache) the kernel's OOM killer ends the process — what a
  device's memory does to a rank, here with resident memory (RSS), not address space.

Elsewhere (the worker, ``ckpt`` tools) nothing is capped.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from pathlib import Path

from cairn.config import TrainConfig
from cairn.trainers.hf import HFCausalLM, HFOptions

MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")
"""Where cgroup v1's memory controller is mounted."""
GROUP_PREFIX = "cairn-test-rank-"
"""The name of each capped rank's cgroup, before the test run's token and its process id."""
GROUP_TOKEN = "CAIRN_TEST_CGROUP_TOKEN"
"""The environment variable naming a test run's groups (set by the test, inherited by its ranks):
another run's groups, left behind or running beside it, are never counted as its own."""


def vm_data() -> int:
    """What ``RLIMIT_DATA`` counts for this process now (``VmData``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def memory_cgroup_of(pid: int | str = "self") -> Path | None:
    """The cgroup v1 memory group of process ``pid``, or None without one (cgroup v2 only, no
    cgroups)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                group = MEMORY_CGROUPS / path.lstrip("/")
                return group if (group / "memory.limit_in_bytes").exists() else None
    return None


def memory_cgroups_writable() -> str | None:
    """None where a capped child group can be made here and a process moved into it (its OOM
    kills counted), else why not (for a test's skip)."""
    parent = memory_cgroup_of()
    if parent is None:
        return "no cgroup v1 memory controller for this process"
    probe = parent / f"{GROUP_PREFIX}probe-{os.getpid()}"
    child = subprocess.Popen(["sleep", "30"])
    try:
        probe.mkdir()
        limit(probe, 1 << 30)
        (probe / "cgroup.procs").write_text(str(child.pid))
        oom_kills(probe)
    except (OSError, RuntimeError) as e:
        return f"cannot make a memory cgroup under {parent} and move a process into it: {e}"
    finally:
        child.kill()
        child.wait()
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


def limit(group: Path, budget: int) -> None:
    """Limit ``group`` to ``budget`` bytes of memory, swap included where the kernel accounts it
    (else a host with swap would page a rank out instead of ending it)."""
    (group / "memory.limit_in_bytes").write_text(str(budget))
    memsw = group / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        memsw.write_text(str(budget))
    else:
        (group / "memory.swappiness").write_text("0")


def capped_groups() -> list[Path]:
    """The capped ranks' groups of this test run (``GROUP_TOKEN`` in the environment) left under
    this process's memory group (they outlive their processes until removed)."""
    parent = memory_cgroup_of()
    token = os.environ.get(GROUP_TOKEN, "")
    return sorted(parent.glob(f"{GROUP_PREFIX}{token}-*")) if parent is not None and token else []


def oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer ended in ``group`` (``memory.oom_control``)."""
    for line in (group / "memory.oom_control").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    raise RuntimeError(f"{group}/memory.oom_control: no oom_kill counter")


def enter_memory_cgroup(budget: int) -> Path:
    """Move this process into a new memory cgroup limited to ``budget`` bytes; returns it."""
    parent = memory_cgroup_of()
    if parent is None:
        raise RuntimeError("rank_memory_budget: no cgroup v1 memory controller for this process")
    group = parent / f"{GROUP_PREFIX}{os.environ.get(GROUP_TOKEN, 'untagged')}-{os.getpid()}"
    group.mkdir()
    limit(group, budget)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


class CappedOptions(HFOptions):
    rank_data_budget: int | None = None
    """Bytes of address space a rank process may add to what it holds when its trainer is built."""
    rank_memory_budget: int | None = None
    """Bytes of resident memory a rank process may touch after its trainer is built (a cgroup)."""


class CappedCausalLM(HFCausalLM):
    """``HFCausalLM`` under a per-rank memory cap (see the module)."""

    Options = CappedOptions
    options: CappedOptions

    def __init__(self, config: TrainConfig, options: CappedOptions) -> None:  # type: ignore[override]
        if "RANK" in os.environ and options.rank_data_budget is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            cap = vm_data() + options.rank_data_budget
            resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
            print(f"rank {os.environ['RANK']}: RLIMIT_DATA {cap >> 20} MiB", flush=True)
        if "RANK" in os.environ and options.rank_memory_budget is not None:
            group = enter_memory_cgroup(options.rank_memory_budget)
            print(
                f"rank {os.environ['RANK']}: {group.name} limited to {options.rank_memory_budget >> 20} MiB", flush=True
            )
        super().__init__(config, options)
