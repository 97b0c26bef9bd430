"""The PyTorch adapter sharded with FSDP2 (``distributed.strategy: fsdp``): parameters, gradients
and optimizer state split across the ranks by ``fully_shard``, each rank saving its own shards
into the same blocked checkpoint a replicated run writes, and any world size reading them back.

- **Sharding** (``shard_model``): ``fully_shard`` on every unit of the wrap policy
  (``TorchTrainer.fsdp_units``: a Hugging Face model's ``_no_split_modules`` blocks by default),
  then on the root, over a 1-D device mesh of the gang (gloo on CPU, NCCL on CUDA); the
  optimizer's groups are pointed at the sharded parameters. FSDP2's mixed-precision policy
  computes in ``distributed.param_dtype`` and reduces gradients in float32.
- **The update** (``sharded_update``): this rank's ``microbatches / W`` microbatches, each seeded
  as in the replicated path, their gradients reduce-scattered by FSDP2 (averaged over the
  ranks, accumulated in the sharded gradients); BatchNorm-like buffers and the loss are
  reduced in the canonical tree; then the one ``apply_update`` (clipping over the sharded
  gradients, the optimizer step on the shards).
- **The state** (``ShardedTensors``): what the adapter's export and import do with a sharded
  model: this rank's dim-0 shards (and their full shapes), written back into the DTensors.
  The engine and its checkpoint layout: ``cairn.trainers.pytorch.fsdp_engine``.

The contract: at one world size, a kill and resume is bit-exact; across world sizes (and
between ``replicated`` and ``fsdp``) FSDP2's reduce-scatter sums in another order, so the run
continues within a tolerance (measured in the docs), recorded in each checkpoint's
``meta.runtime.sharding`` (the lineage keeps the trainer's own ``reproducibility``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from cairn.distributed.comm import Comm
from cairn.distributed.reduce import tree_sum
from cairn.errors import ConfigError, InvariantError
from cairn.trainers.pytorch.data_parallel import (
    install_buffer_means,
    microbatch_rngs,
    microbatch_source,
    microbatch_stats,
    rank_microbatches,
    reduce_microbatches,
)
from cairn.trainers.pytorch.parts import TorchParts
from cairn.trainers.pytorch.state_io import from_numpy, restore_like
from cairn.trainers.pytorch.update import apply_update, backward

__all__ = [
    "ShardedTensors",
    "check_fsdp",
    "default_fsdp_units",
    "rows_of",
    "shard_model",
    "sharded_update",
]


def rows_of(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a dim-0 size ``rows`` that rank ``rank`` of ``world`` holds:
    ``torch.chunk``'s cut, as FSDP2 shards (chunks of ``ceil(rows / world)``; the last ranks
    may hold fewer rows, or none)."""
    chunk = -(-rows // world) if rows else 0
    return min(rows, rank * chunk), min(rows, (rank + 1) * chunk)


def default_fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps one by one before the root: a Hugging Face model's
    ``_no_split_modules`` (its transformer blocks); none otherwise (the root alone)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


def check_fsdp(trainer: TorchParts) -> None:
    """What an FSDP run cannot do, refused in one line before the model is sharded."""
    options = trainer.options
    if options.grad_scaler:
        raise ConfigError(
            "trainer.options.grad_scaler",
            expected="false with distributed.strategy fsdp (FSDP2 computes in param_dtype; no loss scaling)",
            found=True,
        )
    if options.autocast is not None:
        raise ConfigError(
            "trainer.options.autocast",
            expected="unset with distributed.strategy fsdp (use distributed.param_dtype)",
            found=options.autocast,
        )
    scalars = [n for n, p in trainer.params.items() if p.dim() == 0]
    if scalars:
        raise ConfigError(
            "distributed.strategy",
            expected="replicated for a model with 0-dimensional parameters (fully_shard cuts dim 0)",
            found=f"fsdp with {len(scalars)} scalar parameter(s), e.g. {scalars[0]}",
        )
    norms = [n for n, m in trainer.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if trainer.config.distributed is not None and trainer.config.distributed.param_dtype is not None and norms:
        raise ConfigError(
            "distributed.param_dtype",
            expected="unset for a model with BatchNorm (its float32 running statistics meet bfloat16 inputs)",
            found=f"{trainer.config.distributed.param_dtype} with BatchNorm {norms[0] or 'the model'}",
        )
    frozen = [n for n, p in trainer.params.items() if not p.requires_grad]
    if frozen:
        raise ConfigError(
            "distributed.strategy",
            expected="replicated for a model with frozen parameters (LoRA) (fsdp shards trainable models only)",
            found=f"fsdp with {len(frozen)} frozen parameter(s), e.g. {frozen[0]}",
        )


def _process_group_for(comm: Comm, device: torch.device) -> Any:
    """The gang's 1-D device mesh: the process group torchrun made, or (one process, e.g. ``cairn
    train``) a one-rank gloo group of this process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        if comm.world != 1:
            raise InvariantError("an FSDP gang needs torch.distributed", field="comm.world", found=comm.world)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    if dist.get_world_size() != comm.world:
        raise InvariantError(
            "the process group and the gang disagree",
            field="world_size",
            expected=comm.world,
            found=dist.get_world_size(),
        )
    return init_device_mesh(device.type, (comm.world,))


def shard_model(trainer: Any, comm: Comm) -> None:
    """``fully_shard`` the trainer's model (units, then the root) and point its optimizer and
    parameter table at the sharded parameters (FSDP2 replaces the ``Parameter`` objects)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    distributed = trainer.config.distributed
    mesh = _process_group_for(comm, trainer.device)
    compute = None if distributed.param_dtype is None else getattr(torch, distributed.param_dtype)
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32 if compute is not None else None)
    model = trainer.model
    with trainer.user_code("fsdp_units()"):
        units = list(trainer.fsdp_units(model))
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    params = dict(model.named_parameters())
    if set(params) != set(trainer.params):
        raise InvariantError(
            "fully_shard changed the model's parameter names",
            field="model.named_parameters()",
            expected=sorted(trainer.params)[:3],
            found=sorted(params)[:3],
        )
    for group, names in zip(trainer.optimizer.param_groups, trainer.group_params, strict=True):
        group["params"] = [params[n] for n in names]
    trainer.params = params


def _fsdp_modules(model: nn.Module) -> Iterator[Any]:
    from torch.distributed.fsdp import FSDPModule

    return (m for m in model.modules() if isinstance(m, FSDPModule))


COLLECTIVE_WORDS = ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "Socket Timeout")
"""What the text of a collective's failure (not a ``DistError`` subclass in every backend) holds."""


def collective_failure(exc: BaseException) -> bool:
    """A peer died or a collective timed out (FSDP2's forward and backward talk to the other
    ranks): the gang's failure, retried, never the trainer's (``TorchTrainer.user_code``)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in COLLECTIVE_WORDS)


def sharded_update(trainer: TorchParts, step: int, comm: Comm) -> tuple[float, float]:
    """Update ``step + 1`` as this rank's share of an FSDP gang (see the module); returns the
    batch's loss (the tree mean of the microbatch losses, the same on every rank) and its
    learning rate. Runs inside ``TorchTrainer.owned_rngs``."""
    config = trainer.config
    mine, size = rank_microbatches(trainer, comm)
    per_rank = len(mine)
    model, optimizer = trainer.model, trainer.optimizer
    buffers = list(trainer.buffers.values())
    micro = microbatch_source(trainer, step, size)
    stats: list[np.ndarray] = []
    scale = 1.0 / per_rank  # FSDP2 averages over the ranks: the mean over every microbatch
    with trainer.user_code(f"update {step + 1}"):
        model.train()
        start = [b.detach().clone() for b in buffers]
        optimizer.zero_grad(set_to_none=True)
        for i in mine:
            xb, yb = micro(i)
            with torch.no_grad():
                for b, s in zip(buffers, start, strict=True):
                    b.copy_(s)
            with microbatch_rngs(config.seed, step, i, trainer.device):
                loss = trainer.compute_loss(xb, yb)
                backward(trainer, loss * scale if per_rank > 1 else loss)
            stats.append(microbatch_stats(buffers, loss))
    with np.errstate(over="ignore", invalid="ignore"):  # a diverged update is refused by its loss
        mean_stats = reduce_microbatches(comm, tree_sum(stats), trainer.micro_steps)
    with trainer.user_code(f"update {step + 1}"):
        loss_value = install_buffer_means(buffers, mean_stats)
        lr = apply_update(trainer, step)
    return loss_value, lr


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


class ShardedTensors:
    """What the PyTorch adapter's export and import do differently when its model is sharded:
    the state's arrays of sharded tensors are this rank's shards (``stage``), their full shapes
    kept beside them (``full_shapes``), and an import writes shards into the live DTensors."""

    def __init__(self, trainer: Any, comm: Comm) -> None:
        self.trainer, self.comm = trainer, comm
        self.full_shapes: dict[str, tuple[int, ...]] = {}
        """State tensor name -> the full shape of a tensor held as this rank's dim-0 shard."""

    # -- export -------------------------------------------------------------------------------
    def stage(self, name: str, tensor: torch.Tensor) -> np.ndarray:
        if hasattr(tensor, "to_local"):
            self.full_shapes[name] = tuple(tensor.shape)
            tensor = tensor.to_local()
        staged: np.ndarray = self.trainer.staging.stage(name, tensor)  # on a GPU: reused pinned buffers
        return staged

    def prepared(self) -> ShardedTensors:
        """Itself, every FSDP unit resharded first (a forward-only pass, an evaluation, leaves
        the root's parameters gathered): the live parameters are DTensor shards again."""
        for module in _fsdp_modules(self.trainer.model):
            module.reshard()
        return self

    def record(self) -> dict[str, Any]:
        """``meta.runtime.sharding``: how this state was computed (its reproducibility contract)."""
        return {
            "strategy": "fsdp",
            "world_size": self.comm.world,
            "param_dtype": self.trainer.config.distributed.param_dtype,
            "contract": "bit-exact at this world size; within a tolerance across world sizes",
        }

    # -- import -------------------------------------------------------------------------------
    def install(
        self, tensors: Mapping[str, np.ndarray], saved_optimizer: Mapping[str, Any], *, owned: bool = False
    ) -> None:
        """Shards of ``tensors`` (arrays of this rank's rows, as ``TorchFSDP`` reads them) into
        the live parameters and a fresh optimizer state, in fresh storage; or, when ``owned``
        (a restore's own buffers, given up), the optimizer state and buffers in the arrays'
        storage (no second copy of the shard: a restore holds the rows read and the parameters)."""
        trainer = self.trainer
        self.prepared()

        def tensor(arr: np.ndarray) -> torch.Tensor:
            return from_numpy(arr if owned and arr.flags.writeable else np.array(arr, copy=True))

        with torch.no_grad():
            for name, p in trainer.params.items():
                local = _local(p)  # FSDP2's own storage: copied into
                local.copy_(tensor(tensors[f"param/{name}"]).reshape(local.shape))
            for name, b in trainer.buffers.items():
                b.data = tensor(tensors[f"buffer/{name}"]).to(trainer.device)
        optimizer = trainer.optimizer
        optimizer.state.clear()
        host_steps = {  # as ``Optimizer.load_state_dict`` places a step counter (``import_optimizer``)
            id(p): not (g.get("fused") or g.get("capturable")) for g in optimizer.param_groups for p in g["params"]
        }
        for name in saved_optimizer["with_state"]:
            param = trainer.params[name]
            prefix = f"optim/{name}/"
            entry: dict[str, Any] = {}
            for key, arr in tensors.items():
                if not key.startswith(prefix):
                    continue
                value = tensor(arr)
                if value.dim() == 0 and not (key.endswith("/step") and host_steps[id(param)]):
                    value = value.to(param.device)
                elif hasattr(param, "to_local") and value.dim() > 0:
                    from torch.distributed.tensor import DTensor

                    value = DTensor.from_local(
                        value.to(param.device).reshape(param.to_local().shape),
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )
                entry[key[len(prefix) :]] = value
            entry.update(saved_optimizer["scalars"].get(name, {}))
            optimizer.state[param] = entry
        for group, kept in zip(optimizer.param_groups, saved_optimizer["param_groups"], strict=True):
            for key, value in kept.items():
                if key != "params":
                    group[key] = restore_like(group.get(key), value)
