"""The optimizer's per-parameter state, learnt by probing: what validation expects of a
checkpoint's optimizer section follows the user's optimizer, not a hard-coded list."""

from __future__ import annotations

import copy

import torch

from cairn.checkpoint.tensors import TensorSpec
from cairn.trainers.pytorch.parts import OptimizerProbe, TorchParts
from cairn.trainers.pytorch.state_io import jsonable, tensor_spec

__all__ = ["probe_optimizer"]


def probe_optimizer(trainer: TorchParts) -> OptimizerProbe:
    """The optimizer's state: tensors (``NAME/KEY`` -> spec), scalar keys (``KEY`` -> JSON type)
    and the parameters that have any (plain SGD keeps none), from one zero-gradient step of the
    live optimizer, run in the trainer's ``owned_rngs`` (the trainer puts its RNG streams back:
    ``TorchTrainer.optimizer_probe``, once per trainer). Everything else the step touches —
    parameters (weight decay moves them), gradients, optimizer state and groups — is put back
    bit for bit, so the probe needs no second build of the model."""
    t = trainer
    params = list(t.params.values())
    kept_data = [p.detach().clone() for p in params]
    kept_grads = [p.grad for p in params]
    kept_state = {
        p: {k: (v, v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in st.items()}
        for p, st in t.optimizer.state.items()
    }
    kept_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in t.optimizer.param_groups]
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
            return OptimizerProbe(tensors, scalars, stateful)
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
