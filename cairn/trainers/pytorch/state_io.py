"""The PyTorch adapter's state in checkpoint form: RNG states, plain-JSON optimizer and
scheduler values, dtypes, and the checks an RNG state must pass."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cairn.checkpoint.tensors import BFLOAT16, TensorSpec, dtype_tag
from cairn.errors import ConfigError, InvariantError, TensorSpecError

__all__ = [
    "CUDA_RNG_BYTES",
    "MT_WORDS",
    "RngStates",
    "check_rng_json",
    "check_rng_tensor",
    "export_optimizer",
    "group_param_names",
    "import_optimizer",
    "import_whole",
    "from_json",
    "from_numpy",
    "json_kind",
    "jsonable",
    "np_dtype",
    "require_numpy_dtype",
    "restore_like",
    "scheduler_json",
    "state_dict_names",
    "tensor_spec",
    "to_numpy",
]

NONFINITE = "$float"
"""A non-finite float in plain JSON (``{"$float": "inf"}``): scheduler state such as
``ReduceLROnPlateau.best`` starts at infinity."""

MT_WORDS = 624
CUDA_RNG_BYTES = 16
"""A CUDA generator's state (``torch.cuda.get_rng_state``): its seed and its Philox offset, 8
little-endian bytes each; the offset is a multiple of 4."""
Tensor = torch.Tensor
Device = torch.device


@dataclass
class RngStates:
    """The generators a PyTorch training step may draw from: torch's CPU generator, numpy's
    global ``RandomState``, Python's ``random`` and, on a CUDA device, that device's generator."""

    torch: torch.Tensor
    numpy: tuple[Any, ...]
    python: tuple[Any, ...]
    cuda: Tensor | None = None
    device: Device | None = None
    """The CUDA device whose generator ``cuda`` is (None on CPU)."""

    @classmethod
    def capture(cls, device: Device | None = None) -> RngStates:
        numpy_state = np.random.get_state(legacy=True)
        assert isinstance(numpy_state, tuple)
        on_cuda = device is not None and device.type == "cuda"
        return cls(
            torch=torch.get_rng_state(),
            numpy=numpy_state,
            python=random.getstate(),
            cuda=torch.cuda.get_rng_state(device) if device is not None and on_cuda else None,
            device=device if on_cuda else None,
        )

    def install(self) -> None:
        torch.set_rng_state(self.torch)
        np.random.set_state(self.numpy)
        random.setstate(self.python)
        if self.cuda is not None and self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)

    def to_checkpoint(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The states as checkpoint tensors (``rng/torch``, ``rng/numpy``, on CUDA ``rng/cuda``)
        and ``rng_state`` JSON."""
        kind, keys, pos, has_gauss, cached = self.numpy
        py_version, py_state, py_gauss = self.python
        tensors = {"rng/torch": self.torch.numpy(), "rng/numpy": np.asarray(keys, dtype="<u4")}
        if self.cuda is not None:
            tensors["rng/cuda"] = self.cuda.numpy()
        rng = {
            "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        }
        return tensors, rng

    @classmethod
    def from_checkpoint(
        cls, tensors: Mapping[str, np.ndarray], rng: Mapping[str, Any], device: Device | None = None
    ) -> RngStates:
        """The states a checkpoint holds, in fresh storage; the tensors are tried whole first."""
        for name in ("rng/torch", "rng/numpy", "rng/cuda"):  # whole here, whatever blocks a verify saw
            if name in tensors:
                check_rng_tensor(name, tensors[name], whole=True)
        npr, py = rng["numpy"], rng["python"]
        on_cuda = device is not None and device.type == "cuda"
        return cls(
            torch=torch.from_numpy(np.array(tensors["rng/torch"], copy=True)),
            numpy=(
                npr["kind"],
                np.array(tensors["rng/numpy"], dtype=np.uint32),
                npr["pos"],
                npr["has_gauss"],
                npr["cached_gaussian"],
            ),
            python=(py["version"], tuple(py["state"]), py["gauss"]),
            cuda=torch.from_numpy(np.array(tensors["rng/cuda"], copy=True)) if on_cuda else None,
            device=device if on_cuda else None,
        )


def require_numpy_dtype(t: torch.Tensor, where: str) -> None:
    try:
        np_dtype(t)
    except TensorSpecError:
        raise ConfigError(
            where,
            expected="a dtype a checkpoint stores natively (float64/32/16, bfloat16, integer, bool)",
            found=str(t.dtype),
        ) from None


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's storage as a numpy array, without copying (bfloat16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def from_numpy(arr: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``arr``'s memory (the inverse of ``to_numpy``)."""
    if arr.dtype == BFLOAT16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def jsonable(value: Any, where: str, *, nonfinite: bool = False) -> Any:
    """Plain JSON of optimizer/scheduler state values (tuples -> lists, 0-d tensors refused
    here: tensors go to the tensor section). With ``nonfinite`` an infinity or NaN is written as
    ``{"$float": "inf"}`` (``from_json`` reads it back exactly); without, it is refused."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            if nonfinite:
                return {NONFINITE: repr(value)}
            raise TensorSpecError(
                "state the adapter cannot write as JSON", field=where, expected="a finite number", found=value
            )
        return value
    if isinstance(value, tuple | list):
        return [jsonable(v, f"{where}[{i}]", nonfinite=nonfinite) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): jsonable(v, f"{where}.{k}", nonfinite=nonfinite) for k, v in value.items()}
    raise TensorSpecError(
        "state the adapter cannot write as JSON", field=where, expected="plain JSON values", found=type(value).__name__
    )


def from_json(value: Any, where: str) -> Any:
    """``value`` with its ``{"$float": ...}`` entries turned back into floats (see ``jsonable``)."""
    if isinstance(value, dict):
        if set(value) == {NONFINITE}:
            text = value[NONFINITE]
            if text not in ("inf", "-inf", "nan"):
                raise InvariantError(field=where, expected="inf, -inf or nan", found=text)
            return float(text)
        return {k: from_json(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def restore_like(template: Any, value: Any) -> Any:
    """``value`` (from JSON) in the Python type of ``template`` (a tuple stays a tuple)."""
    if isinstance(template, tuple) and isinstance(value, list):
        return tuple(restore_like(t, v) for t, v in zip(template, value, strict=True))
    if isinstance(template, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def np_dtype(t: torch.Tensor) -> str:
    """The checkpoint's dtype tag of a tensor (``bfloat16`` for bf16, numpy's string otherwise)."""
    if t.dtype == torch.bfloat16:
        return dtype_tag(BFLOAT16)
    try:
        return dtype_tag(torch.empty((), dtype=t.dtype).numpy().dtype)
    except TypeError:
        raise TensorSpecError(
            "tensor dtype has no raw little-endian numpy form",
            field="dtype",
            expected="a numpy dtype",
            found=str(t.dtype),
        ) from None


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(np_dtype(t), tuple(t.shape))


def check_rng_tensor(name: str, values: np.ndarray, *, whole: bool = False) -> None:
    """Refuse an RNG state tensor no generator accepts (``rng/torch`` is tried on a scratch
    ``torch.Generator``; an all-zero MT19937 key is no reachable state). A verify may see a piece
    of a blocked tensor (``whole`` False): only a complete one is tried."""
    problem = None
    if name == "rng/torch" and (whole or values.size == torch_rng_bytes()):
        try:
            torch.Generator().set_state(torch.from_numpy(np.array(values, dtype=np.uint8, copy=True)).flatten())
        except (RuntimeError, TypeError, ValueError) as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    elif name == "rng/numpy" and (whole or values.size == MT_WORDS) and not np.any(values):
        problem = "an all-zero MT19937 key"
    elif name == "rng/cuda" and (whole or values.size == CUDA_RNG_BYTES):
        raw = np.asarray(values, dtype=np.uint8).reshape(-1)
        if raw.size != CUDA_RNG_BYTES:
            problem = f"{raw.size} bytes, not {CUDA_RNG_BYTES}"
        elif int(raw[8:].view("<i8")[0]) % 4:
            problem = "a Philox offset that is not a multiple of 4"
    if problem is not None:
        raise InvariantError(
            "RNG state is not a state its generator accepts",
            field=f"tensors[{name}]",
            expected="a generator state",
            found=problem,
        )


@functools.cache
def torch_rng_bytes() -> int:
    return int(torch.get_rng_state().numel())


def check_rng_json(rng: Any) -> None:
    def bad(field: str, expected: Any, found: Any) -> InvariantError:
        return InvariantError("RNG state is malformed", field=field, expected=expected, found=found)

    if not isinstance(rng, Mapping) or set(rng) != {"numpy", "python"}:
        raise bad("rng", "numpy and python states", sorted(rng) if isinstance(rng, Mapping) else rng)
    npr = rng["numpy"]
    if not isinstance(npr, Mapping) or npr.get("kind") != "MT19937":
        raise bad("rng.numpy.kind", "MT19937", npr.get("kind") if isinstance(npr, Mapping) else npr)
    pos = npr.get("pos")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos <= MT_WORDS:
        raise bad("rng.numpy.pos", f"an integer in [0, {MT_WORDS}]", pos)
    if npr.get("has_gauss") not in (0, 1) or not isinstance(npr.get("cached_gaussian"), float | int):
        raise bad("rng.numpy.has_gauss", "0 or 1 and a cached gaussian", npr.get("has_gauss"))
    py = rng["python"]
    state = py.get("state") if isinstance(py, Mapping) else None
    if not isinstance(py, Mapping) or py.get("version") != 3 or not isinstance(state, list) or len(state) != 625:
        raise bad(
            "rng.python", "version 3 with 625 state words", None if not isinstance(py, Mapping) else py.get("version")
        )
    if not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w < (1 << 32) for w in state[:624]):
        raise bad("rng.python.state", "624 words in [0, 2**32)", "other values")
    if not isinstance(state[624], int) or not 0 <= state[624] <= 624:
        raise bad("rng.python.state[624]", "an index in [0, 624]", state[624])
    if py.get("gauss") is not None and not isinstance(py.get("gauss"), float):
        raise bad("rng.python.gauss", "null or a float", py.get("gauss"))
    if not any(state[:624]):
        raise bad("rng.python.state", "a reachable Mersenne Twister state", "624 zero words")
    try:
        random.Random().setstate((3, tuple(state), py.get("gauss")))
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad("rng.python", "a state random.setstate accepts", str(exc)) from None


def export_optimizer(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    group_params: list[list[str]],
    tensors: dict[str, np.ndarray],
    stage: Callable[[str, torch.Tensor], np.ndarray] | None = None,
) -> dict[str, Any]:
    """The optimizer's state: its tensors into ``tensors`` (``optim/NAME/KEY``: zero-copy, or
    through ``stage`` for a device), the rest as ``meta.optimizer`` (param groups by parameter
    name, scalars, who has state)."""
    scalars: dict[str, dict[str, Any]] = {}
    with_state = []
    for name, p in params.items():
        st = optimizer.state.get(p)
        if not st:
            continue
        with_state.append(name)
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                entry = f"optim/{name}/{key}"
                tensors[entry] = to_numpy(value) if stage is None else stage(entry, value)
            else:
                scalars.setdefault(name, {})[key] = jsonable(value, f"optimizer.state[{name}].{key}")
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        body = {k: jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in group.items() if k != "params"}
        groups.append({**body, "params": group_params[i]})
    return {"param_groups": groups, "with_state": with_state, "scalars": scalars}


def import_optimizer(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    tensors: Mapping[str, np.ndarray],
    saved: Mapping[str, Any],
) -> None:
    """Install ``export_optimizer``'s form of a state in ``optimizer``, in fresh storage; on a
    device, each tensor on its parameter's device (a ``step`` counter stays on the CPU, as
    ``Optimizer.load_state_dict`` keeps it unless the group is fused or capturable)."""
    optimizer.state.clear()
    host_steps = {
        id(p): not (g.get("fused") or g.get("capturable")) for g in optimizer.param_groups for p in g["params"]
    }
    for name in saved["with_state"]:
        entry: dict[str, Any] = {}
        prefix = f"optim/{name}/"
        param = params[name]
        for key, arr in tensors.items():
            if key.startswith(prefix):
                value = from_numpy(np.array(arr, copy=True))
                if param.device.type != "cpu" and not (key.endswith("/step") and host_steps[id(param)]):
                    value = value.to(param.device)
                entry[key[len(prefix) :]] = value
        entry.update(saved["scalars"].get(name, {}))
        optimizer.state[params[name]] = entry
    for group, kept in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        for key, value in kept.items():
            if key != "params":
                group[key] = restore_like(group.get(key), value)


def scheduler_json(scheduler: Any) -> Any:
    """An LR scheduler's state as plain JSON, infinities kept (None without a scheduler)."""
    if scheduler is None:
        return None
    return jsonable(scheduler.state_dict(), "scheduler.state_dict()", nonfinite=True)


def state_dict_names(
    model: torch.nn.Module, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor]
) -> tuple[dict[str, str], dict[str, str]]:
    """The model's ``state_dict`` keys as checkpoint names: each parameter or persistent buffer
    under its own key (``param/KEY``, ``buffer/KEY``), and the tied aliases (a key whose tensor
    is a parameter held under another name, e.g. ``lm_head.weight`` = the token embedding)."""
    owner = {id(t): f"param/{n}" for n, t in params.items()}
    owner.update({id(t): f"buffer/{n}" for n, t in buffers.items()})
    names: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        name = owner.get(id(tensor))
        if name is None:
            raise ConfigError(f"model.state_dict()[{key}]", expected="a parameter or buffer", found="another tensor")
        if name.partition("/")[2] == key:
            names[key] = name
        else:
            aliases[key] = name
    return names, aliases


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def group_param_names(optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Each param group's parameters by name; a tensor that is not the model's is refused."""
    names = {id(p): n for n, p in params.items()}
    out: list[list[str]] = []
    for i, group in enumerate(optimizer.param_groups):
        try:
            out.append([names[id(p)] for p in group["params"]])
        except KeyError:
            raise ConfigError(
                f"optimizer.param_groups[{i}]", expected="parameters of the model only", found="a foreign tensor"
            ) from None
    return out


def import_whole(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    tensors: Mapping[str, np.ndarray],
    saved: Mapping[str, Any],
    device: torch.device,
) -> None:
    """A whole (unsharded) state's weights and optimizer state into the live objects, in fresh
    storage on ``device``."""
    with torch.no_grad():
        for name, p in params.items():
            p.data = from_numpy(np.array(tensors[f"param/{name}"], copy=True)).to(device)
        for name, b in buffers.items():
            b.data = from_numpy(np.array(tensors[f"buffer/{name}"], copy=True)).to(device)
    import_optimizer(optimizer, params, tensors, saved)
