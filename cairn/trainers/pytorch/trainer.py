"""The PyTorch adapter: bring an ``nn.Module``, any ``torch.optim`` optimizer, an optional LR
scheduler and a dataset; get full-state checkpoints, validated import and bit-exact resume.

Subclass ``TorchTrainer`` and implement ``build``::

    class MyTrainer(TorchTrainer):
        Options = MyOptions                 # a TorchOptions subclass: your config section

        def build(self) -> TorchSetup:
            model = MyNet(self.options.width)
            opt = torch.optim.AdamW(model.parameters(), lr=self.options.lr)
            return TorchSetup(model=model, optimizer=opt, train=(x, y), val=(xv, yv), version="mynet-v1")

and name it in the run config: ``"trainer": {"factory": "mypkg.train:MyTrainer", "options": {...}}``.

**What a checkpoint holds** (raw tensors and JSON — never pickle; reading uses no
``torch.load``): every parameter (``param/NAME``) and buffer (``buffer/NAME``); the
optimizer's per-parameter state (``optim/NAME/KEY``, tensors, with non-tensor values in
``meta.optimizer.scalars``) and its param groups (``meta.optimizer.param_groups``, parameters
by name); the scheduler's state (``meta.scheduler``); the RNG states — torch's CPU generator
(``rng/torch``), numpy's global generator (``rng/numpy`` + ``rng.numpy``) and Python's
``random`` (``rng.python``); and the data position (``meta.data``: epoch, position). Tensors
are handed to the writer as zero-copy numpy views of the live tensors.

**Reproducibility contract.** On CPU, in the same build of torch, with
``torch.use_deterministic_algorithms(True)`` and a fixed thread count (``options.threads``,
set and recorded by the adapter), a resumed run is bit-identical to an uninterrupted one
(``lineage.reproducibility = "bit-exact"``). Set ``options.deterministic = false`` (or run
kernels without deterministic implementations) and the run records ``"tolerance"``: compare
with ``cairn ckpt compare --rtol/--atol``. The adapter owns the process's global RNGs and
thread settings while it trains, so a worker runs one torch segment at a time (a lock).

**Data parallel.** With a ``distributed`` config an update is the microbatched one of
``cairn.trainers.pytorch.data_parallel`` — here in one process, or by a gang of rank processes
(``TorchDP``) — and every world size dividing ``distributed.microbatches`` gives the same bits.

**Data.** ``train``/``val``/``test`` are ``(x, y)`` pairs of tensors or arrays (indexed by
batch), or any map-style ``torch.utils.data.Dataset`` (items collated with
``default_collate``). Batches come from ``cairn.sampler.EpochSampler``: a seeded permutation
per epoch, so a resume mid-epoch draws exactly the batches the uninterrupted run would.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate

from cairn.config import TrainConfig
from cairn.distributed.comm import Comm, SoloComm
from cairn.errors import CairnError, ConfigError, InvariantError, TensorSpecError, TrainerCodeError
from cairn.sampler import EpochSampler
from cairn.state import Lineage, TrainState
from cairn.trainers.base import StepCallback, TensorSpec, Trainer, check_finite, model_hash

__all__ = ["TorchOptions", "TorchSetup", "TorchTrainer", "DataSplit"]

DataSplit = tuple[Any, Any] | TorchDataset  # type: ignore[type-arg]
_PROCESS_LOCK = threading.RLock()
"""Global RNGs, thread count and deterministic mode are process-wide: one torch trainer at a time."""
_MT_WORDS = 624


@dataclass
class _RngStates:
    """The three generators a PyTorch training step may draw from: torch's CPU generator,
    numpy's global ``RandomState`` and Python's ``random``."""

    torch: torch.Tensor
    numpy: tuple[Any, ...]
    python: tuple[Any, ...]

    @classmethod
    def capture(cls) -> _RngStates:
        numpy_state = np.random.get_state(legacy=True)
        assert isinstance(numpy_state, tuple)
        return cls(torch=torch.get_rng_state(), numpy=numpy_state, python=random.getstate())

    def install(self) -> None:
        torch.set_rng_state(self.torch)
        np.random.set_state(self.numpy)
        random.setstate(self.python)


def _require_numpy_dtype(t: torch.Tensor, where: str) -> None:
    try:
        _np_dtype(t)
    except TensorSpecError:
        raise ConfigError(
            where, expected="a dtype with a raw numpy form (float32/64/16, integer, bool)", found=str(t.dtype)
        ) from None


class TorchOptions(BaseModel):
    """The adapter's own options; subclass it to add your model's (it is your config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(default=1, ge=1, le=256)
    """Intra-op threads (``torch.set_num_threads``): part of the bit-exact contract."""
    deterministic: bool = True
    """``torch.use_deterministic_algorithms``; false: the run records the tolerance contract."""
    scheduler_interval: Literal["step", "epoch"] = "step"
    """When the LR scheduler steps: after every update, or at every epoch end."""
    eval_batch_size: int = Field(default=1024, ge=1, le=1 << 20)


@dataclass
class TorchSetup:
    """What ``TorchTrainer.build`` returns: the objects the adapter trains and checkpoints."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train: DataSplit
    scheduler: Any = None
    """A ``torch.optim.lr_scheduler.LRScheduler`` (its ``state_dict`` must be plain JSON)."""
    val: DataSplit | None = None
    test: DataSplit | None = None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    version: str = "torch-model-v1"
    """The model's version, recorded in the lineage."""
    data_version: str = "data-v1"


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


class _Split:
    """A data split with batch access by index array, and its content hash."""

    def __init__(self, data: DataSplit, name: str) -> None:
        self.name = name
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.dataset: Any = None
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ConfigError(f"{name} data", expected="an (x, y) pair", found=f"a tuple of {len(data)}")
            x, y = _as_tensor(data[0]), _as_tensor(data[1])
            if x.shape[0] != y.shape[0]:
                raise ConfigError(f"{name} data", expected="x and y of equal length", found=(x.shape, y.shape))
            self.x, self.y = x, y
            self.n = int(x.shape[0])
        else:
            self.dataset = data
            self.n = len(data)  # type: ignore[arg-type]

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.x is not None and self.y is not None:
            index = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
            return self.x[index], self.y[index]
        xb, yb = default_collate([self.dataset[int(i)] for i in idx])
        return xb, yb

    def content_hash(self, h: Any) -> None:
        h.update(f"{self.name}:{self.n}".encode())
        batches = [np.arange(s, min(s + 4096, self.n)) for s in range(0, self.n, 4096)]
        for idx in batches:
            for t in self.batch(idx):
                arr = t.detach().contiguous().numpy()
                h.update(f"{arr.dtype.str}{arr.shape}".encode())
                h.update(arr.tobytes())


def _jsonable(value: Any, where: str) -> Any:
    """Plain JSON of optimizer/scheduler state values (tuples -> lists, 0-d tensors refused
    here: tensors go to the tensor section)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TensorSpecError(
                "state the adapter cannot write as JSON", field=where, expected="a finite number", found=value
            )
        return value
    if isinstance(value, tuple | list):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    raise TensorSpecError(
        "state the adapter cannot write as JSON", field=where, expected="plain JSON values", found=type(value).__name__
    )


def _restore_like(template: Any, value: Any) -> Any:
    """``value`` (from JSON) in the Python type of ``template`` (a tuple stays a tuple)."""
    if isinstance(template, tuple) and isinstance(value, list):
        return tuple(_restore_like(t, v) for t, v in zip(template, value, strict=True))
    if isinstance(template, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class TorchTrainer(Trainer):
    """The adapter. Subclass it, set ``Options`` and implement ``build``; see the module docstring."""

    Options: ClassVar[type[BaseModel]] = TorchOptions
    options: TorchOptions

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        super().__init__(config, options)
        if not isinstance(options, TorchOptions):
            raise ConfigError("trainer.options", expected="a TorchOptions subclass", found=type(options).__name__)
        self._optim_probe: tuple[dict[str, TensorSpec], dict[str, type]] | None = None
        self._rng: _RngStates | None = None
        with self._runtime():
            self._setup()
        hasher = hashlib.sha256()
        with self._user_code("hashing the data splits"):
            for split in self.splits.values():
                split.content_hash(hasher)
        self._data_hash = "sha256:" + hasher.hexdigest()
        self.sampler = EpochSampler(self.splits["train"].n, config.batch_size, config.seed)
        self.eval_history = "val" in self.splits

    # -- the user's part ------------------------------------------------------------------
    def build(self) -> TorchSetup:
        """Build the model, optimizer, scheduler and data (called with the RNGs seeded)."""
        raise NotImplementedError(f"{type(self).__name__}.build")

    # -- runtime ----------------------------------------------------------------------------
    @contextmanager
    def _runtime(self) -> Iterator[None]:
        with _PROCESS_LOCK:
            torch.set_num_threads(self.options.threads)
            torch.use_deterministic_algorithms(self.options.deterministic)
            yield

    @contextmanager
    def _user_code(self, what: str) -> Iterator[None]:
        """The trainer's own code runs here: its failures are typed (``TrainerCodeError``, not
        retried: the same state raises again), Cairn's own errors pass through."""
        try:
            yield
        except CairnError:
            raise
        except Exception as exc:
            raise TrainerCodeError(f"{self.path}: {what} raised {type(exc).__name__}: {exc}"[:500]) from exc

    @contextmanager
    def _owned_rngs(self) -> Iterator[None]:
        """Install this trainer's private RNG states in the process's global generators for the
        duration (the user's forward/backward/step draw from them), then take them back and
        restore whatever was there before: code running between updates (a save's retry jitter,
        another thread) can neither perturb the run's streams nor be perturbed by them."""
        outer = _RngStates.capture()
        assert self._rng is not None
        self._rng.install()
        try:
            yield
        finally:
            self._rng = _RngStates.capture()
            outer.install()

    def _setup(self) -> None:
        seed = self.config.seed
        outer = _RngStates.capture()
        try:
            torch.manual_seed(seed)
            np.random.seed(seed % (1 << 32))
            random.seed(seed)
            with self._user_code("build()"):
                setup = self.build()
            self._rng = _RngStates.capture()  # the run's streams start after build()
        finally:
            outer.install()
        if not isinstance(setup, TorchSetup):
            raise ConfigError(f"{self.path}.build()", expected="a TorchSetup", found=type(setup).__name__)
        if isinstance(setup.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ConfigError(
                f"{self.path}.build(): scheduler",
                expected="an LR scheduler stepped by updates or epochs (its state plain JSON)",
                found="ReduceLROnPlateau (steps on a metric; its state holds infinity)",
            )
        self.setup = setup
        self.model = setup.model
        self.optimizer = setup.optimizer
        self.scheduler = setup.scheduler
        self.splits = {
            name: _Split(data, name)
            for name, data in (("train", setup.train), ("val", setup.val), ("test", setup.test))
            if data is not None
        }
        self.params = dict(self.model.named_parameters())
        self.buffers = dict(self.model.named_buffers())
        names = {id(p): n for n, p in self.params.items()}
        self.group_params: list[list[str]] = []
        for i, group in enumerate(self.optimizer.param_groups):
            try:
                self.group_params.append([names[id(p)] for p in group["params"]])
            except KeyError:
                raise ConfigError(
                    f"optimizer.param_groups[{i}]", expected="parameters of the model only", found="a foreign tensor"
                ) from None
        for name, t in [*self.params.items(), *self.buffers.items()]:
            if t.device.type != "cpu":
                raise ConfigError(f"model tensor {name}", expected="on the CPU", found=str(t.device))
            _require_numpy_dtype(t, f"model tensor {name}")
        for split in self.splits.values():
            for part, data in (("x", split.x), ("y", split.y)):
                if data is not None:
                    _require_numpy_dtype(data, f"{split.name} data {part}")
        self._fresh_scheduler = (
            None if self.scheduler is None else _jsonable(self.scheduler.state_dict(), "scheduler.state_dict()")
        )
        self._fresh_groups = [
            {k: _jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in g.items() if k != "params"}
            for i, g in enumerate(self.optimizer.param_groups)
        ]

    # -- identity ---------------------------------------------------------------------------
    @property
    def data_hash(self) -> str:
        return self._data_hash

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    @property
    def reproducibility(self) -> str:
        return "bit-exact" if self.options.deterministic else "tolerance"

    def lineage(self) -> Lineage:
        return Lineage(
            dataset_version=self.setup.data_version,
            dataset_hash=self.data_hash,
            model_version=self.setup.version,
            tokenizer_version=self.config.tokenizer_version,
            stage_contract=self.config.stage,
            trainer=self.path,
            model_hash=model_hash({n: s for n, s in self._weight_specs().items()}),
            reproducibility=self.reproducibility,
        )

    # -- export / import ----------------------------------------------------------------------
    def _weight_specs(self) -> dict[str, TensorSpec]:
        out = {f"param/{n}": _spec(p) for n, p in self.params.items()}
        out.update({f"buffer/{n}": _spec(b) for n, b in self.buffers.items()})
        return out

    def _export(self, step: int, history: dict[str, list[float]], lineage: Lineage) -> TrainState:
        """The live state as a TrainState whose arrays are zero-copy views of the live tensors."""
        tensors: dict[str, np.ndarray] = {}
        for name, p in self.params.items():
            tensors[f"param/{name}"] = p.detach().numpy()
        for name, b in self.buffers.items():
            tensors[f"buffer/{name}"] = b.detach().numpy()
        scalars: dict[str, dict[str, Any]] = {}
        with_state = []
        for name, p in self.params.items():
            st = self.optimizer.state.get(p)
            if not st:
                continue
            with_state.append(name)
            for key, value in st.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optim/{name}/{key}"] = value.detach().numpy()
                else:
                    scalars.setdefault(name, {})[key] = _jsonable(value, f"optimizer.state[{name}].{key}")
        groups = []
        for i, group in enumerate(self.optimizer.param_groups):
            body = {k: _jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in group.items() if k != "params"}
            groups.append({**body, "params": self.group_params[i]})
        assert self._rng is not None
        tensors["rng/torch"] = self._rng.torch.numpy()
        kind, keys, pos, has_gauss, cached = self._rng.numpy
        tensors["rng/numpy"] = np.asarray(keys, dtype="<u4")
        py_version, py_state, py_gauss = self._rng.python
        meta: dict[str, Any] = {
            "data": self.sampler.cursor_json(step),
            "optimizer": {"param_groups": groups, "with_state": with_state, "scalars": scalars},
            "scheduler": None
            if self.scheduler is None
            else _jsonable(self.scheduler.state_dict(), "scheduler.state_dict()"),
            "runtime": {
                "threads": self.options.threads,
                "deterministic": self.options.deterministic,
                "torch": torch.__version__,
            },
        }
        rng = {
            "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        }
        return TrainState(
            config=self.config,
            lineage=lineage,
            tensors=tensors,
            step=step,
            cursor=step * self.config.batch_size,
            rng_state=rng,
            history=history,
            meta=meta,
        )

    def _load(self, state: TrainState) -> None:
        """Make the live objects hold ``state`` — in fresh storage, so nothing the caller holds
        aliases what training will mutate (``state`` itself is never modified)."""
        t = state.tensors
        with torch.no_grad():
            for name, p in self.params.items():
                p.data = torch.from_numpy(np.array(t[f"param/{name}"], copy=True))
            for name, b in self.buffers.items():
                b.data = torch.from_numpy(np.array(t[f"buffer/{name}"], copy=True))
        opt_meta = state.meta["optimizer"]
        self.optimizer.state.clear()
        for name in opt_meta["with_state"]:
            p = self.params[name]
            entry: dict[str, Any] = {}
            prefix = f"optim/{name}/"
            for key, arr in t.items():
                if key.startswith(prefix):
                    entry[key[len(prefix) :]] = torch.from_numpy(np.array(arr, copy=True))
            entry.update(opt_meta["scalars"].get(name, {}))
            self.optimizer.state[p] = entry
        for group, saved in zip(self.optimizer.param_groups, opt_meta["param_groups"], strict=True):
            for key, value in saved.items():
                if key != "params":
                    group[key] = _restore_like(group.get(key), value)
        if self.scheduler is not None:
            with self._user_code("scheduler.load_state_dict()"):
                self.scheduler.load_state_dict(copy.deepcopy(state.meta["scheduler"]))
        npr = state.rng_state["numpy"]
        py = state.rng_state["python"]
        for name in ("rng/torch", "rng/numpy"):  # whole here, whatever blocks a verify saw
            check_rng_tensor(name, t[name], whole=True)
        self._rng = _RngStates(
            torch=torch.from_numpy(np.array(t["rng/torch"], copy=True)),
            numpy=(
                npr["kind"],
                np.array(t["rng/numpy"], dtype=np.uint32),
                npr["pos"],
                npr["has_gauss"],
                npr["cached_gaussian"],
            ),
            python=(py["version"], tuple(py["state"]), py["gauss"]),
        )

    # -- the trainer interface ---------------------------------------------------------------
    def init_state(self) -> TrainState:
        with self._runtime():
            self._setup()
            history: dict[str, list[float]] = {"loss": [], "lr": []}
            if self.eval_history:
                history.update({"val_step": [], "val_loss": [], "val_accuracy": []})
            return self._export(0, history, self.lineage()).copy()

    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        if steps < 0:
            raise ConfigError("steps", expected=">= 0", found=steps)
        with self._runtime():
            self._load(state)
            history = {k: list(v) for k, v in state.history.items()}
            step = state.step
            work = self._export(step, history, state.lineage)
            for _ in range(steps):
                self._advance(step, history)
                step += 1
                work = self._export(step, history, work.lineage)
                if on_step is not None and on_step(work):
                    break
            return work

    def _advance(self, step: int, history: dict[str, list[float]], comm: Comm | None = None) -> float:
        """Update ``step + 1`` of the live objects, then the scheduler and (at an epoch end) the
        evaluation, recorded in ``history``; returns the update's loss. With a ``distributed``
        config the update is the microbatched data-parallel one (``cairn.trainers.pytorch.data_parallel``)
        over ``comm`` (this process alone when None): ``cairn train`` and a gang of any size
        compute the same bits. Its collectives run outside ``_user_code`` (a peer's failure is
        the gang's, not the trainer's code's)."""
        epoch_end = (step + 1) % self.steps_per_epoch == 0
        what = f"update {step + 1}"
        with self._owned_rngs():
            if self.config.distributed is None:
                with self._user_code(what):
                    loss, lr = self._update(step)
            else:
                from cairn.trainers.pytorch.data_parallel import microbatched_update

                loss, lr = microbatched_update(self, step, SoloComm() if comm is None else comm)
            with self._user_code(what):
                if self.scheduler is not None and (self.options.scheduler_interval == "step" or epoch_end):
                    self.scheduler.step()
                metrics = self._evaluate_live("val") if epoch_end and self.eval_history else None
        history["loss"].append(loss)
        history["lr"].append(lr)
        if metrics is not None:
            history["val_step"].append(float(step + 1))
            history["val_loss"].append(metrics["loss"])
            history["val_accuracy"].append(metrics["accuracy"])
        return loss

    def _update(self, step: int) -> tuple[float, float]:
        model, optimizer = self.model, self.optimizer
        model.train()
        xb, yb = self.splits["train"].batch(self.sampler.batch(step))
        optimizer.zero_grad(set_to_none=True)
        loss = self.setup.loss_fn(model(xb), yb)
        loss.backward()  # type: ignore[no-untyped-call]
        lr = float(optimizer.param_groups[0]["lr"])
        optimizer.step()
        return float(loss.detach()), lr

    def _evaluate_live(self, split: str) -> dict[str, float]:
        data = self.splits[split]
        model = self.model
        was_training = model.training
        model.eval()
        total_loss, correct = 0.0, 0
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            np_state, py_state = np.random.get_state(), random.getstate()
            for start in range(0, data.n, self.options.eval_batch_size):
                idx = np.arange(start, min(start + self.options.eval_batch_size, data.n))
                xb, yb = data.batch(idx)
                out = model(xb)
                total_loss += float(self.setup.loss_fn(out, yb)) * len(idx)
                correct += int((out.argmax(dim=1) == yb).sum())
            np.random.set_state(np_state)
            random.setstate(py_state)
        model.train(was_training)
        return {"loss": total_loss / max(1, data.n), "accuracy": correct / max(1, data.n)}

    def evaluate(self, state: TrainState, split: str) -> dict[str, float] | None:
        if split not in self.splits or split == "train":
            return None
        with self._runtime():
            self._load(state)
            with self._owned_rngs(), self._user_code(f"evaluation on {split}"):
                return self._evaluate_live(split)

    def is_weight(self, name: str) -> bool:
        return name.startswith(("param/", "buffer/"))

    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        out = self._weight_specs()
        out["rng/torch"] = TensorSpec(_np_dtype(torch.get_rng_state()), tuple(torch.get_rng_state().shape))
        out["rng/numpy"] = TensorSpec("<u4", (_MT_WORDS,))
        optimizer = meta.get("optimizer") if isinstance(meta, Mapping) else None
        with_state = optimizer.get("with_state", []) if isinstance(optimizer, Mapping) else []
        if isinstance(with_state, list) and with_state:
            probe, _ = self._probe_optimizer()
            for name in with_state:
                for key, spec in probe.items():
                    pname, _, k = key.partition("/")
                    if pname == name:
                        out[f"optim/{name}/{k}"] = spec
        return out

    def _probe_optimizer(self) -> tuple[dict[str, TensorSpec], dict[str, type]]:
        """The optimizer's per-parameter state — tensors (``NAME/KEY`` -> spec) and scalar keys
        (``KEY`` -> JSON type) — learnt from one zero-gradient step on a second build of the model,
        so validation follows the optimizer, not a hard-coded list."""
        if self._optim_probe is None:
            live = (self.setup, self.model, self.optimizer, self.scheduler, self.splits, self.params, self.buffers)
            kept = (self.group_params, self._rng, self._fresh_scheduler, self._fresh_groups)
            with self._runtime():
                try:
                    self._setup()
                    for p in self.params.values():
                        if p.requires_grad:
                            p.grad = torch.zeros_like(p)
                    with self._owned_rngs(), self._user_code("optimizer.step() (probing its state)"):
                        self.optimizer.step()
                    tensors: dict[str, TensorSpec] = {}
                    scalars: dict[str, type] = {}
                    for name, p in self.params.items():
                        for key, value in self.optimizer.state.get(p, {}).items():
                            if isinstance(value, torch.Tensor):
                                tensors[f"{name}/{key}"] = _spec(value)
                            else:
                                scalars[key] = type(_jsonable(value, f"optimizer.state[{name}].{key}"))
                    self._optim_probe = (tensors, scalars)
                finally:
                    self.setup, self.model, self.optimizer, self.scheduler, self.splits, self.params, self.buffers = (
                        live
                    )
                    self.group_params, self._rng, self._fresh_scheduler, self._fresh_groups = kept
        return self._optim_probe

    def check_state(self, step: int, cursor: int, rng: Any, meta: Mapping[str, Any]) -> None:
        self.check_cursor(step, cursor)
        self.sampler.check_cursor(step, meta.get("data"))
        _check_rng_json(rng)
        optimizer = meta.get("optimizer")
        if not isinstance(optimizer, Mapping) or set(optimizer) != {"param_groups", "with_state", "scalars"}:
            raise InvariantError(
                "optimizer state is malformed",
                field="meta.optimizer",
                expected="param_groups, with_state, scalars",
                found=None if not isinstance(optimizer, Mapping) else sorted(optimizer),
            )
        groups = optimizer["param_groups"]
        if not isinstance(groups, list) or len(groups) != len(self.optimizer.param_groups):
            raise InvariantError(
                "optimizer param groups do not match the model's optimizer",
                field="meta.optimizer.param_groups",
                expected=f"{len(self.optimizer.param_groups)} groups",
                found=len(groups) if isinstance(groups, list) else type(groups).__name__,
            )
        for i, (saved, live) in enumerate(zip(groups, self.optimizer.param_groups, strict=True)):
            want_keys = sorted(live)
            if not isinstance(saved, Mapping) or sorted(saved) != want_keys:
                raise InvariantError(
                    "optimizer param group has other settings than this optimizer",
                    field=f"meta.optimizer.param_groups[{i}]",
                    expected=want_keys,
                    found=sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__,
                )
            if saved["params"] != self.group_params[i]:
                raise InvariantError(
                    "optimizer param group holds other parameters",
                    field=f"meta.optimizer.param_groups[{i}].params",
                    expected=self.group_params[i][:8],
                    found=saved["params"][:8] if isinstance(saved["params"], list) else saved["params"],
                )
            for key, fresh in self._fresh_groups[i].items():
                _check_like(saved[key], fresh, f"meta.optimizer.param_groups[{i}].{key}", exact=False)
        with_state = optimizer["with_state"]
        trainable = [n for n, p in self.params.items() if p.requires_grad]
        want_state = [] if step == 0 else trainable
        if not isinstance(with_state, list) or sorted(map(str, with_state)) != sorted(want_state):
            raise InvariantError(
                "optimizer state must cover every trainable parameter after the first update (none before)",
                field="meta.optimizer.with_state",
                expected=f"{len(want_state)} parameters" if want_state else [],
                found=f"{len(with_state)} entries" if isinstance(with_state, list) else type(with_state).__name__,
            )
        scalars = optimizer["scalars"]
        _, scalar_types = self._probe_optimizer() if with_state else ({}, {})
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
                if _json_kind(entry[key]) != _json_kind(kind()):
                    raise InvariantError(
                        field=f"meta.optimizer.scalars[{name}].{key}", expected=kind.__name__, found=entry[key]
                    )
        has_scheduler = meta.get("scheduler") is not None
        if has_scheduler != (self.scheduler is not None):
            raise InvariantError(
                "scheduler state does not match the setup",
                field="meta.scheduler",
                expected="a scheduler state" if self.scheduler is not None else None,
                found="a scheduler state" if has_scheduler else None,
            )
        if self._fresh_scheduler is not None:
            _check_like(meta["scheduler"], self._fresh_scheduler, "meta.scheduler", exact=True)
        runtime = meta.get("runtime")
        want_runtime = {"threads": self.options.threads, "deterministic": self.options.deterministic}
        if not isinstance(runtime, Mapping) or {k: runtime.get(k) for k in want_runtime} != want_runtime:
            raise InvariantError(
                "checkpoint was trained under another runtime contract",
                field="meta.runtime",
                expected=want_runtime,
                found=dict(runtime) if isinstance(runtime, Mapping) else runtime,
            )
        extra = set(meta) - {"data", "optimizer", "scheduler", "runtime"}
        if extra:
            raise InvariantError("unexpected trainer state", field="meta", expected=None, found=sorted(extra))

    def check_values(self, name: str, values: np.ndarray) -> None:
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


NON_NEGATIVE_STATE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf"})
"""Optimizer state keys (Adam/AdamW, RMSprop, Adagrad, Adadelta, Adamax) that hold squares."""
SCHEDULER_PROGRESS = frozenset(
    {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "T_cur", "T_i"}
)
"""Scheduler state that advances with training; every other field must equal a fresh build's."""


def _json_kind(value: Any) -> str:
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


def _check_like(saved: Any, fresh: Any, field: str, *, exact: bool) -> None:
    """``saved`` (from a checkpoint) has the shape of ``fresh`` (this setup's own value): the same
    JSON kinds, list lengths and keys; with ``exact``, values equal too, except the scheduler's
    progress fields (``SCHEDULER_PROGRESS``)."""
    if _json_kind(saved) != _json_kind(fresh):
        raise InvariantError(
            field=field, expected=_json_kind(fresh), found=saved if _json_kind(saved) != "object" else "an object"
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


def _np_dtype(t: torch.Tensor) -> str:
    try:
        return np.dtype(torch.empty((), dtype=t.dtype).numpy().dtype).str
    except TypeError:
        raise TensorSpecError(
            "tensor dtype has no raw little-endian numpy form",
            field="dtype",
            expected="a numpy dtype",
            found=str(t.dtype),
        ) from None


def _spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(_np_dtype(t), tuple(t.shape))


def check_rng_tensor(name: str, values: np.ndarray, *, whole: bool = False) -> None:
    """Refuse an RNG state tensor no generator accepts (``rng/torch`` is tried on a scratch
    ``torch.Generator``; an all-zero MT19937 key is no reachable state). A verify may see a piece
    of a blocked tensor (``whole`` False): only a complete one is tried."""
    problem = None
    if name == "rng/torch" and (whole or values.size == _torch_rng_bytes()):
        try:
            torch.Generator().set_state(torch.from_numpy(np.array(values, dtype=np.uint8, copy=True)).flatten())
        except (RuntimeError, TypeError, ValueError) as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    elif name == "rng/numpy" and (whole or values.size == _MT_WORDS) and not np.any(values):
        problem = "an all-zero MT19937 key"
    if problem is not None:
        raise InvariantError(
            "RNG state is not a state its generator accepts",
            field=f"tensors[{name}]",
            expected="a generator state",
            found=problem,
        )


@functools.cache
def _torch_rng_bytes() -> int:
    return int(torch.get_rng_state().numel())


def _check_rng_json(rng: Any) -> None:
    def bad(field: str, expected: Any, found: Any) -> InvariantError:
        return InvariantError("RNG state is malformed", field=field, expected=expected, found=found)

    if not isinstance(rng, Mapping) or set(rng) != {"numpy", "python"}:
        raise bad("rng", "numpy and python states", sorted(rng) if isinstance(rng, Mapping) else rng)
    npr = rng["numpy"]
    if not isinstance(npr, Mapping) or npr.get("kind") != "MT19937":
        raise bad("rng.numpy.kind", "MT19937", npr.get("kind") if isinstance(npr, Mapping) else npr)
    pos = npr.get("pos")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos <= _MT_WORDS:
        raise bad("rng.numpy.pos", f"an integer in [0, {_MT_WORDS}]", pos)
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
