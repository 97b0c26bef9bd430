"""A checkpoint's state as a PyTorch Distributed Checkpoint (DCP) directory, written by torch's
own ``dcp.save`` (single process) so that ``torch.distributed.checkpoint.load`` reads it, into a
hidden sibling directory renamed into place when every file is durable (as ``export``).

The layout is the one ``torch.distributed.checkpoint.state_dict`` uses, nested under two keys:
``{"model": {KEY: tensor}, "optimizer": {"state": {FQN: {"exp_avg": ..., "step": ...}},
"param_groups": [{..., "params": [FQN, ...]}]}}`` (DCP flattens it to ``model.KEY``,
``optimizer.state.FQN.exp_avg``...). ``KEY`` is the model's ``state_dict`` key
(``WeightExchange.exchange_names``, tied aliases included) and ``FQN`` its parameter's name, which
FSDP2 keeps: ``get_state_dict(model, optimizer)`` of the same model, ``dcp.load`` of it and
``set_state_dict`` restore both, sharded or not. The optimizer part is written for a state in the
PyTorch adapter's form (``optim/FQN/KEY`` tensors and ``meta.optimizer``); a param group's lists
(``betas``) become tuples, as torch's optimizers keep them."""

from __future__ import annotations

import secrets
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from cairn.checkpoint.tensors import BFLOAT16_TAG, dtype_tag
from cairn.errors import MissingExtraError
from cairn.interop.exchange import WeightExchange
from cairn.interop.export import ExportResult, _destination, _publish
from cairn.state import TrainState

__all__ = ["export_dcp", "optimizer_state_dict"]

OPTIM_PREFIX = "optim/"


def _torch() -> Any:
    try:
        import torch
        import torch.distributed.checkpoint
    except ImportError:
        raise MissingExtraError("torch", "torch", "ckpt export --format dcp") from None
    return torch


def _tensor(torch: Any, arr: np.ndarray) -> Any:
    """A CPU tensor holding a copy of ``arr`` (bfloat16 through its bits)."""
    if dtype_tag(arr.dtype) == BFLOAT16_TAG:
        return torch.from_numpy(np.array(arr.view(np.int16), copy=True)).view(torch.bfloat16)
    return torch.from_numpy(np.array(arr, copy=True))


def optimizer_state_dict(state: TrainState, tensor: Any = None) -> dict[str, Any] | None:
    """The optimizer of a state in the PyTorch adapter's form as ``get_state_dict`` gives it
    (FQN-keyed ``state`` and ``param_groups``); None for a state without one. ``tensor`` turns
    an array into the values written (default: the arrays themselves)."""
    saved = state.meta.get("optimizer")
    if not isinstance(saved, dict) or not {"param_groups", "with_state", "scalars"} <= set(saved):
        return None
    convert = tensor or (lambda arr: arr)
    per_param: dict[str, dict[str, Any]] = {name: {} for name in saved["with_state"]}
    for key, arr in state.tensors.items():
        if key.startswith(OPTIM_PREFIX):
            name, _, entry = key[len(OPTIM_PREFIX) :].rpartition("/")
            per_param.setdefault(name, {})[entry] = convert(arr)
    for name, scalars in saved["scalars"].items():
        per_param.setdefault(name, {}).update(scalars)
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
        for group in saved["param_groups"]
    ]
    return {"state": per_param, "param_groups": groups}


def export_dcp(
    state: TrainState, trainer: WeightExchange, out_dir: Path, *, weights_only: bool = False
) -> ExportResult:
    """Write ``state`` (read and checked by ``load_training``) into ``out_dir`` as a DCP: the
    model's weights under ``model`` and, unless ``weights_only`` or the state has none in the
    PyTorch adapter's form, its optimizer under ``optimizer`` (module docstring)."""
    torch = _torch()
    _destination(out_dir)
    names, aliases = trainer.exchange_names()
    model = {key: _tensor(torch, state.tensors[name]) for key, name in {**names, **aliases}.items()}
    body: dict[str, Any] = {"model": model}
    optimizer = None if weights_only else optimizer_state_dict(state, lambda arr: _tensor(torch, arr))
    if optimizer is not None:
        body["optimizer"] = optimizer
    result = ExportResult(out_dir, "dcp" if optimizer is not None else "dcp-weights-only")
    result.tensors = len(model) + sum(
        isinstance(v, torch.Tensor) for entry in (optimizer or {}).get("state", {}).values() for v in entry.values()
    )
    tmp = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        with warnings.catch_warnings():  # one process on purpose: "assuming the intent is to save in a single process"
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            torch.distributed.checkpoint.save(body, checkpoint_id=tmp, no_dist=True)
        result.files = sorted(p.name for p in tmp.iterdir())
        result.bytes = sum((tmp / name).stat().st_size for name in result.files)
        _publish(tmp, out_dir, result.files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
