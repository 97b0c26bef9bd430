"""The collective engine a rank talks through: ``torch.distributed`` (gloo on CPU, NCCL for a run
on CUDA), or one process.

``TorchComm`` wraps an initialised default process group; ``SoloComm`` is world size 1 with
no collective at all (the in-process reference). Both move numpy arrays (float64 vectors,
zero-copy into torch tensors) and small JSON documents (as uint8 tensors: nothing is pickled,
unlike ``all_gather_object``). Every rank must make the same calls in the same order. Over NCCL
each collective's tensors are copied to the rank's GPU and back: the canonical reduction
(``cairn.distributed.reduce``) sums on the host in a fixed order, which is what makes every
world size compute the same bits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

import numpy as np

__all__ = ["Comm", "SoloComm", "TorchComm", "init_torch_comm"]


class Comm(Protocol):
    rank: int
    world: int

    def exchange(
        self, send: np.ndarray, send_sizes: Sequence[int], recv_sizes: Sequence[int], out: np.ndarray | None = None
    ) -> np.ndarray:
        """All-to-all of a flat vector: ``send_sizes[j]`` elements go to rank j, in order;
        ``recv_sizes[j]`` come from rank j, concatenated in rank order (into ``out`` if given)."""
        ...

    def all_gather_float(self, value: float) -> list[float]: ...

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank."""
        ...

    def all_gather_json(self, doc: Any) -> list[Any]: ...

    def broadcast_json(self, doc: Any) -> Any:
        """Rank 0's ``doc`` on every rank."""
        ...

    def barrier(self) -> None: ...


class SoloComm:
    """World size 1: every collective is the identity."""

    rank = 0
    world = 1

    def exchange(
        self, send: np.ndarray, send_sizes: Sequence[int], recv_sizes: Sequence[int], out: np.ndarray | None = None
    ) -> np.ndarray:
        if out is None:
            return send[: recv_sizes[0]].copy()
        out[:] = send[: recv_sizes[0]]
        return out

    def all_gather_float(self, value: float) -> list[float]:
        return [value]

    def any(self, flag: bool) -> bool:
        return flag

    def all_gather_json(self, doc: Any) -> list[Any]:
        return [json.loads(json.dumps(doc))]

    def broadcast_json(self, doc: Any) -> Any:
        return json.loads(json.dumps(doc))

    def barrier(self) -> None:
        pass


class TorchComm:
    """``torch.distributed`` collectives over the default process group (gloo or NCCL)."""

    def __init__(self, device: str | None = None) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self._device = None if device is None else torch.device(device)
        """The GPU NCCL's tensors live on (None: gloo on host tensors)."""
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def _on(self, t: Any) -> Any:
        return t if self._device is None else t.to(self._device)

    def _host(self, t: Any) -> Any:
        return t if self._device is None else t.cpu()

    def exchange(
        self, send: np.ndarray, send_sizes: Sequence[int], recv_sizes: Sequence[int], out: np.ndarray | None = None
    ) -> np.ndarray:
        torch = self._torch
        if out is None:
            out = np.empty(sum(recv_sizes), dtype=send.dtype)
        received = self._on(torch.from_numpy(out))
        self._dist.all_to_all_single(
            received,
            self._on(torch.from_numpy(np.ascontiguousarray(send))),
            output_split_sizes=list(recv_sizes),
            input_split_sizes=list(send_sizes),
        )
        if self._device is not None:
            out[:] = received.cpu().numpy()
        return out

    def all_gather_float(self, value: float) -> list[float]:
        torch = self._torch
        out = self._on(torch.zeros(self.world, dtype=torch.float64))
        self._dist.all_gather_into_tensor(out, self._on(torch.tensor([value], dtype=torch.float64)))
        return [float(x) for x in self._host(out).numpy()]

    def any(self, flag: bool) -> bool:
        t = self._on(self._torch.tensor([1 if flag else 0], dtype=self._torch.int64))
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return bool(t.item())

    def all_gather_json(self, doc: Any) -> list[Any]:
        torch = self._torch
        raw = np.frombuffer(json.dumps(doc, allow_nan=False).encode(), dtype=np.uint8)
        sizes = self._on(torch.zeros(self.world, dtype=torch.int64))
        self._dist.all_gather_into_tensor(sizes, self._on(torch.tensor([raw.size], dtype=torch.int64)))
        sizes = self._host(sizes)
        width = int(sizes.max().item())
        mine = torch.zeros(width, dtype=torch.uint8)
        mine[: raw.size] = torch.from_numpy(raw.copy())
        out = self._on(torch.zeros(width * self.world, dtype=torch.uint8))
        self._dist.all_gather_into_tensor(out, self._on(mine))
        data = self._host(out).numpy()
        return [
            json.loads(data[r * width : r * width + int(sizes[r].item())].tobytes().decode()) for r in range(self.world)
        ]

    def broadcast_json(self, doc: Any) -> Any:
        return self.all_gather_json(doc if self.rank == 0 else None)[0]

    def barrier(self) -> None:
        self._dist.barrier()


def init_torch_comm(timeout_seconds: float = 120.0, device: str | None = None) -> TorchComm:
    """Join the process group ``torchrun`` describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the
    environment): over gloo, or over NCCL with this rank bound to ``device`` (``cuda:N``, one GPU
    per rank); a collective waits at most ``timeout_seconds`` for a peer."""
    import torch
    import torch.distributed as dist

    if device is not None:
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_seconds)
        if device is None:
            dist.init_process_group("gloo", timeout=timeout)
        else:
            dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(device))
    return TorchComm(device)
