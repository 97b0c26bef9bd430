"""What a PyTorch adapter checkpoint's JSON must hold to fit this setup: the optimizer's groups
and state, the scheduler's state and the runtime contract; and what its streamed data's cursor
says changed in the files when the checkpoint's data hash is not the run's."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cairn.checkpoint.tensors import TensorSpec
from cairn.errors import CairnError, ConfigError, InvariantError
from cairn.trainers.base import check_finite
from cairn.trainers.pytorch.evaluation import MAX_METRICS, METRIC_NAME
from cairn.trainers.pytorch.parts import TorchParts
from cairn.trainers.pytorch.state_io import (
    CUDA_RNG_BYTES,
    MT_WORDS,
    check_rng_json,
    check_rng_tensor,
    from_json,
    json_kind,
    np_dtype,
    require_numpy_dtype,
)
from cairn.trainers.pytorch.streams import Stream

__all__ = [
    "NON_NEGATIVE_STATE",
    "SCHEDULER_PROGRESS",
    "changed_data_error",
    "check_eval_meta",
    "check_optimizer_meta",
    "check_runtime_meta",
    "check_scaler_meta",
    "check_scheduler_meta",
    "check_setup",
    "check_values",
    "checkpoint_specs",
    "check_checkpoint_state",
    "LEGACY_EVAL",
]

LEGACY_EVAL = {"metrics": ["accuracy"]}
"""``meta.eval`` of a checkpoint written before the adapter recorded it."""

NON_NEGATIVE_STATE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf"})
"""Optimizer state keys (Adam/AdamW, RMSprop, Adagrad, Adadelta, Adamax) that hold squares."""


SCHEDULER_PROGRESS = frozenset(
    {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "T_cur", "T_i"}
    | {"best", "num_bad_epochs", "cooldown_counter"}  # ReduceLROnPlateau
)
"""Scheduler state that advances with training; every other field must equal a fresh build's."""


def _check_like(saved: Any, fresh: Any, field: str, *, exact: bool) -> None:
    """``saved`` (from a checkpoint) has the shape of ``fresh`` (this setup's own value): the same
    JSON kinds, list lengths and keys; with ``exact``, values equal too, except the scheduler's
    progress fields (``SCHEDULER_PROGRESS``)."""
    if json_kind(saved) != json_kind(fresh):
        raise InvariantError(
            field=field, expected=json_kind(fresh), found=saved if json_kind(saved) != "object" else "an object"
        )
    if isinstance(fresh, Mapping):
        if set(saved) != set(fresh):
            raise InvariantError(
                "state has other fields than this setup's", field=field, expected=sorted(fresh), found=sorted(saved)
            )
        for key in fresh:
            progress = key in SCHEDULER_PROGRESS
            _check_like(saved[key], fresh[key], f"{field}.{key}", exact=exact and not progress)
    elif isinstance(fresh, list | tuple):
        if len(saved) != len(fresh):
            raise InvariantError(field=field, expected=f"{len(fresh)} values", found=f"{len(saved)} values")
        for i, (a, b) in enumerate(zip(saved, fresh, strict=True)):
            _check_like(a, b, f"{field}[{i}]", exact=exact)
    elif exact and saved != fresh:
        raise InvariantError(
            "differs from this setup's (only progress may differ)", field=field, expected=fresh, found=saved
        )


def check_optimizer_meta(
    optimizer: Any,
    step: int,
    live_groups: Sequence[Mapping[str, Any]],
    group_params: Sequence[list[str]],
    fresh_groups: Sequence[Mapping[str, Any]],
    stateful: Callable[[], list[str]],
    probe_scalars: Callable[[], dict[str, type]],
) -> None:
    """``meta.optimizer`` fits this optimizer: its param groups (same settings, same
    parameters), state after the first update for every parameter a probe step gave state
    (``stateful``: plain SGD keeps none), and scalar state of the types the probe produced
    (``probe_scalars``, called only when there is state)."""
    if not isinstance(optimizer, Mapping) or set(optimizer) != {"param_groups", "with_state", "scalars"}:
        raise InvariantError(
            "optimizer state is malformed",
            field="meta.optimizer",
            expected="param_groups, with_state, scalars",
            found=None if not isinstance(optimizer, Mapping) else sorted(optimizer),
        )
    groups = optimizer["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise InvariantError(
            "optimizer param groups do not match the model's optimizer",
            field="meta.optimizer.param_groups",
            expected=f"{len(live_groups)} groups",
            found=len(groups) if isinstance(groups, list) else type(groups).__name__,
        )
    for i, (saved, live) in enumerate(zip(groups, live_groups, strict=True)):
        want_keys = sorted(live)
        if not isinstance(saved, Mapping) or sorted(saved) != want_keys:
            raise InvariantError(
                "optimizer param group has other settings than this optimizer",
                field=f"meta.optimizer.param_groups[{i}]",
                expected=want_keys,
                found=sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__,
            )
        if saved["params"] != group_params[i]:
            raise InvariantError(
                "optimizer param group holds other parameters",
                field=f"meta.optimizer.param_groups[{i}].params",
                expected=group_params[i][:8],
                found=saved["params"][:8] if isinstance(saved["params"], list) else saved["params"],
            )
        for key, fresh in fresh_groups[i].items():
            _check_like(saved[key], fresh, f"meta.optimizer.param_groups[{i}].{key}", exact=False)
    with_state = optimizer["with_state"]
    want_state = [] if step == 0 else stateful()
    if not isinstance(with_state, list) or sorted(map(str, with_state)) != sorted(want_state):
        raise InvariantError(
            "optimizer state must cover every parameter the optimizer keeps state for, after the first update",
            field="meta.optimizer.with_state",
            expected=f"{len(want_state)} parameters" if want_state else [],
            found=f"{len(with_state)} entries" if isinstance(with_state, list) else type(with_state).__name__,
        )
    scalars = optimizer["scalars"]
    scalar_types = probe_scalars() if with_state else {}
    if not isinstance(scalars, Mapping) or not set(scalars) <= set(with_state):
        raise InvariantError("optimizer scalars name parameters without state", field="meta.optimizer.scalars")
    for name in with_state:
        entry = scalars.get(name, {})
        if not isinstance(entry, Mapping) or set(entry) != set(scalar_types):
            raise InvariantError(
                "optimizer scalar state has other keys than this optimizer",
                field=f"meta.optimizer.scalars[{name}]",
                expected=sorted(scalar_types),
                found=sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__,
            )
        for key, kind in scalar_types.items():
            if json_kind(entry[key]) != json_kind(kind()):
                raise InvariantError(
                    field=f"meta.optimizer.scalars[{name}].{key}", expected=kind.__name__, found=entry[key]
                )


def check_scheduler_meta(saved: Any, has_live: bool, fresh: Any) -> None:
    """``meta.scheduler`` is present exactly when the setup has a scheduler, shaped like a fresh
    build's state, equal to it except for the progress fields."""
    has_scheduler = saved is not None
    if has_scheduler != has_live:
        raise InvariantError(
            "scheduler state does not match the setup",
            field="meta.scheduler",
            expected="a scheduler state" if has_live else None,
            found="a scheduler state" if has_scheduler else None,
        )
    if fresh is not None:  # infinities ({"$float": "inf"}) compared as the floats they are
        _check_like(
            from_json(saved, "meta.scheduler"), from_json(fresh, "meta.scheduler"), "meta.scheduler", exact=True
        )


def check_runtime_meta(meta: Mapping[str, Any], threads: int, deterministic: bool) -> None:
    """``meta.runtime`` names this trainer's thread count and deterministic mode, and ``meta``
    holds nothing else than the adapter's sections."""
    runtime = meta.get("runtime")
    want_runtime = {"threads": threads, "deterministic": deterministic}
    if not isinstance(runtime, Mapping) or {k: runtime.get(k) for k in want_runtime} != want_runtime:
        raise InvariantError(
            "checkpoint was trained under another runtime contract",
            field="meta.runtime",
            expected=want_runtime,
            found=dict(runtime) if isinstance(runtime, Mapping) else runtime,
        )
    extra = set(meta) - {"data", "optimizer", "scheduler", "runtime", "scaler", "eval"}
    if extra:
        raise InvariantError("unexpected trainer state", field="meta", expected=None, found=sorted(extra))


def check_setup(trainer: TorchParts) -> None:
    """What a ``TorchSetup`` must be for the adapter's options and the run's config: refused at
    build, with the option to change, never at the first update or the first evaluation."""
    options, config = trainer.options, trainer.config
    for name, t in [*trainer.params.items(), *trainer.buffers.items()]:
        if t.device != trainer.device:
            raise ConfigError(f"model tensor {name}", expected=f"on {trainer.device}", found=str(t.device))
        require_numpy_dtype(t, f"model tensor {name}")
    for split in trainer.splits.values():
        for part, data in (("x", getattr(split, "x", None)), ("y", getattr(split, "y", None))):
            if data is not None:
                require_numpy_dtype(data, f"{split.name} data {part}")
    k = trainer.micro_steps
    if config.distributed is not None and options.accumulation not in (1, k):
        raise ConfigError(
            "trainer.options.accumulation: it is distributed.microbatches in a distributed run",
            expected=f"1 or {k}",
            found=options.accumulation,
        )
    if config.batch_size % k:
        raise ConfigError(
            "batch_size", expected=f"a multiple of the {k} micro-steps of an update", found=config.batch_size
        )
    train = trainer.splits["train"]
    if getattr(train, "stream", False) and options.epoch_steps is None and train.batches_per_pass is None:  # type: ignore[union-attr]
        raise ConfigError(
            "trainer.options.epoch_steps: the training stream has no len()",
            expected="the updates an epoch means (a stream without len() needs it, however the run is measured)",
            found=None,
        )
    if trainer.plateau and "val" not in trainer.splits:
        raise ConfigError(
            "TorchSetup.val: ReduceLROnPlateau steps on the validation loss", expected="a val split", found=None
        )
    if options.grad_scaler and options.autocast != "float16":
        raise ConfigError(
            "trainer.options.grad_scaler: loss scaling is for float16 autocast",
            expected="autocast 'float16'",
            found=options.autocast,
        )


def check_scaler_meta(saved: Any, fresh: Any) -> None:
    """``meta.scaler`` (the loss scaler's state) is there exactly when the setup scales losses,
    with a fresh scaler's fields and a finite, positive scale."""
    if (saved is None) != (fresh is None):
        raise InvariantError(
            "loss-scaler state does not match the setup",
            field="meta.scaler",
            expected="a GradScaler state" if fresh is not None else None,
            found="a GradScaler state" if saved is not None else None,
        )
    if fresh is None:
        return
    _check_like(saved, fresh, "meta.scaler", exact=False)
    scale = saved["scale"]
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not 0 < scale < float("inf"):
        raise InvariantError(field="meta.scaler.scale", expected="a finite scale > 0", found=scale)


def check_eval_meta(saved: Any, eval_history: bool) -> None:
    """``meta.eval.metrics`` names the metrics recorded at every evaluation: distinct metric
    names, sorted."""
    if not eval_history:
        if saved is not None:
            raise InvariantError("evaluation record without a val split", field="meta.eval", expected=None, found=saved)
        return
    names: Any = saved.get("metrics") if isinstance(saved, Mapping) and set(saved) == {"metrics"} else None
    if (
        not isinstance(names, list)
        or len(names) > MAX_METRICS
        or not all(isinstance(n, str) and METRIC_NAME.match(n) and n != "loss" for n in names)
    ):
        raise InvariantError(
            "evaluation record is malformed",
            field="meta.eval.metrics",
            expected=f"<= {MAX_METRICS} metric names",
            found=names,
        )
    if names != sorted(set(names)):
        raise InvariantError(
            "evaluation metrics must be sorted and distinct",
            field="meta.eval.metrics",
            expected=sorted(set(names)),
            found=names,
        )


def check_values(name: str, values: np.ndarray) -> None:
    """Value rules of the adapter's tensors: RNG states a generator accepts, finite floats,
    second-moment optimizer state >= 0."""
    if name.startswith("rng/"):
        check_rng_tensor(name, values)
        return
    check_finite(name, values)
    squares = name.startswith("optim/") and name.rsplit("/", 1)[-1] in NON_NEGATIVE_STATE
    if squares and values.size and values.min() < 0:
        raise InvariantError(
            "optimizer second-moment state must be >= 0",
            field=f"tensors[{name}]",
            expected=">= 0",
            found=float(values.min()),
        )


def checkpoint_specs(trainer: TorchParts, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
    """The tensors a checkpoint of ``trainer`` holds: weights, RNG states (``rng/cuda`` on a CUDA
    device) and the optimizer state of the parameters ``meta.optimizer`` says have it (their
    specs probed from the live optimizer)."""
    out = trainer.weight_specs()
    out["rng/torch"] = TensorSpec(np_dtype(torch.get_rng_state()), tuple(torch.get_rng_state().shape))
    out["rng/numpy"] = TensorSpec("<u4", (MT_WORDS,))
    if trainer.options.device != "cpu":  # a GPU run's checkpoint, wherever it is read
        out["rng/cuda"] = TensorSpec("|u1", (CUDA_RNG_BYTES,))
    optimizer = meta.get("optimizer") if isinstance(meta, Mapping) else None
    with_state = optimizer.get("with_state", []) if isinstance(optimizer, Mapping) else []
    if isinstance(with_state, list) and with_state:
        names = set(with_state)
        for key, spec in trainer.optimizer_probe().tensors.items():  # NAME/KEY -> spec
            if key.partition("/")[0] in names:
                out[f"optim/{key}"] = spec
    return out


def check_checkpoint_state(trainer: TorchParts, step: int, rng: Any, meta: Mapping[str, Any]) -> None:
    """A checkpoint's JSON part fits ``trainer``: data position, RNG form, optimizer, scheduler,
    loss scaler, evaluation and runtime contract."""
    train = trainer.splits["train"]
    if isinstance(train, Stream):
        train.check(step, meta.get("data"))
    else:
        trainer.epoch_sampler.check_cursor(step, meta.get("data"))
    check_rng_json(rng)
    check_optimizer_meta(
        meta.get("optimizer"),
        step,
        trainer.optimizer.param_groups,
        trainer.group_params,
        trainer.fresh_groups,
        lambda: trainer.optimizer_probe().stateful,
        lambda: trainer.optimizer_probe().scalars,
    )
    check_scheduler_meta(meta.get("scheduler"), trainer.scheduler is not None, trainer.fresh_scheduler)
    check_scaler_meta(meta.get("scaler"), trainer.fresh_scaler)
    check_eval_meta(meta.get("eval", LEGACY_EVAL if trainer.eval_history else None), trainer.eval_history)
    check_runtime_meta(meta, trainer.options.threads, trainer.options.deterministic)


def changed_data_error(train: object, meta: Mapping[str, Any]) -> CairnError | None:
    """What changed in a streamed training split's data since the checkpoint whose JSON part is
    ``meta``, as its loader says (``RecordLoader.data_change``: the file whose digest differs
    from the one the cursor records); None when the loader cannot say."""
    data = meta.get("data")
    change = getattr(train.loader, "data_change", None) if isinstance(train, Stream) else None
    if not callable(change) or not isinstance(data, Mapping):
        return None
    error = change(data.get("stream"))
    return error if isinstance(error, CairnError) else None
