"""Where the adapter's tensors live: the ``device`` option resolved (``cpu``, ``cuda``,
``cuda:N``), batches placed on it, and ``HostStaging`` — the reused (pinned, on CUDA) host
buffers a device state is copied into so that a checkpoint reads host memory.

On CPU nothing here copies: the state's arrays are zero-copy views of the live tensors, as
before devices existed. On a device every tensor of the state is copied into its own host
buffer (allocated once, reused by every later export of the same tensor), all copies queued
asynchronously, then one synchronisation: the export costs the state's bytes over the host
link. A staged buffer changes only at the next export, which is what the zero-copy views of a
CPU state do at the next update: whoever keeps a state across updates copies it (as async
save's snapshot does), so later in-place updates never reach a saved snapshot."""

from __future__ import annotations

import os
import re
from typing import Any, TypeVar, cast

import numpy as np
import torch

from cairn.errors import ConfigError
from cairn.trainers.pytorch.state_io import to_numpy

__all__ = ["DEVICE_PATTERN", "HostStaging", "device_record", "place", "resolve_device"]

T = TypeVar("T")
DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]{1,2})?)$"


CUBLAS_DETERMINISTIC = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS (what ``use_deterministic_algorithms`` requires)."""


def resolve_device(option: str) -> torch.device:
    """The ``device`` option as a torch device; ``cuda`` is the current CUDA device (a gang rank
    binds its ``LOCAL_RANK`` before building the trainer). Refused at once where it is not.
    On CUDA it sets ``CUBLAS_WORKSPACE_CONFIG`` (unless the environment does) before cuBLAS
    starts: cuBLAS reads it once per process, and deterministic runs need it."""
    if not re.fullmatch(DEVICE_PATTERN, option):
        raise ConfigError("trainer.options.device", expected="cpu, cuda or cuda:N", found=option)
    if option == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            "trainer.options.device",
            expected="a CUDA device (torch.cuda.is_available())",
            found=f"{option} on a machine without one (torch {torch.__version__})",
        )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)  # before cuBLAS first starts
    index = int(option.partition(":")[2] or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        raise ConfigError("trainer.options.device", expected=f"< {torch.cuda.device_count()} GPUs", found=option)
    return torch.device("cuda", index)


def device_record(device: torch.device) -> dict[str, str]:
    """What a checkpoint's ``meta.runtime`` records of the GPU it was computed on (recorded, not
    enforced: bit-exact resume needs the same GPU model, driver and torch build); {} on CPU."""
    if device.type != "cuda":
        return {}
    return {"gpu": torch.cuda.get_device_name(device), "cuda": str(torch.version.cuda)}


def place(value: T, device: torch.device) -> T:
    """``value`` (a tensor, or tuples/lists/dicts of them) on ``device``; on CPU, ``value`` itself."""
    if device.type == "cpu":
        return value
    moved: Any = value
    if isinstance(value, torch.Tensor):
        moved = value.to(device, non_blocking=True)
    elif isinstance(value, tuple | list):
        moved = type(value)(place(v, device) for v in value)
    elif isinstance(value, dict):
        moved = {k: place(v, device) for k, v in value.items()}
    return cast(T, moved)


class HostStaging:
    """Host buffers, one per tensor name, that device tensors are copied into (see the module).
    ``always`` stages CPU tensors too (the same path, testable on any machine)."""

    def __init__(self, *, pin: bool, always: bool = False) -> None:
        self.pin, self.always = pin, always
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations = 0
        """Buffers allocated so far (an export of an unchanged state allocates none)."""
        self._pending: set[torch.device] = set()

    def stage(self, name: str, tensor: torch.Tensor) -> np.ndarray:
        """A host array holding ``tensor``'s values once ``wait`` returns."""
        if tensor.device.type == "cpu" and not self.always:
            return to_numpy(tensor)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin)
            self._buffers[name] = buf
            self.allocations += 1
        buf.copy_(tensor.detach(), non_blocking=tensor.device.type != "cpu")
        if tensor.device.type == "cuda":
            self._pending.add(tensor.device)
        return to_numpy(buf)

    def wait(self) -> None:
        """Every copy queued by ``stage`` has landed."""
        for device in self._pending:  # synchronize() alone waits for the current device only
            torch.cuda.synchronize(device)
        self._pending.clear()
