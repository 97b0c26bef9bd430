"""The optimizer's per-parameter state, learnt by probing: what validation expects of a
checkpoint's optimizer section follows the user's optimizer, not a hard-coded list."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from cairn.trainers.base import TensorSpec
from cairn.trainers.pytorch.state_io import jsonable, tensor_spec

if TYPE_CHECKING:
    from cairn.trainers.pytorch.trainer import TorchTrainer

__all__ = ["probe_optimizer"]


def probe_optimizer(trainer: TorchTrainer) -> tuple[dict[str, TensorSpec], dict[str, type], list[str]]:
    """The optimizer's state: tensors (``NAME/KEY`` -> spec), scalar keys (``KEY`` -> JSON type)
    and the parameters that have any (plain SGD keeps none), from one zero-gradient step of the
    live optimizer (once per trainer). Everything the step touches — parameters (weight decay
    moves them), gradients, optimizer state and groups, the run's RNG streams — is put back
    bit for bit, so the probe needs no second build of the model."""
    t = trainer
    if t._optim_probe is None:
        params = list(t.params.values())
        kept_data = [p.detach().clone() for p in params]
        kept_grads = [p.grad for p in params]
        kept_state = {
            p: {k: (v, v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in st.items()}
            for p, st in t.optimizer.state.items()
        }
        kept_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in t.optimizer.param_groups]
        kept_rng, pristine = t._rng, t.pristine
        with t.runtime():
            try:
                for p in params:
                    p.grad = torch.zeros_like(p) if p.requires_grad else None
                with t.owned_rngs(), t.user_code("optimizer.step() (probing its state)"):
                    t.optimizer.step()
                tensors: dict[str, TensorSpec] = {}
                scalars: dict[str, type] = {}
                stateful = [name for name, p in t.params.items() if t.optimizer.state.get(p)]
                for name, p in t.params.items():
                    for key, value in t.optimizer.state.get(p, {}).items():
                        if isinstance(value, torch.Tensor):
                            tensors[f"{name}/{key}"] = tensor_spec(value)
                        else:
                            scalars[key] = type(jsonable(value, f"optimizer.state[{name}].{key}"))
                t._optim_probe = (tensors, scalars, stateful)
            finally:
                with torch.no_grad():
                    for p, data, grad in zip(params, kept_data, kept_grads, strict=True):
                        p.copy_(data)
                        p.grad = grad
                    t.optimizer.state.clear()  # the same tensor objects, their values put back
                    for key, entries in kept_state.items():
                        t.optimizer.state[key] = {
                            k: orig.copy_(value) if isinstance(orig, torch.Tensor) else value
                            for k, (orig, value) in entries.items()
                        }
                for group, saved in zip(t.optimizer.param_groups, kept_groups, strict=True):
                    group.update(saved)
                t._rng, t.pristine = kept_rng, pristine
    return t._optim_probe
