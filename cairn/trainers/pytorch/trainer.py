"""``TorchTrainer``: an ``nn.Module``, a ``torch.optim`` optimizer, an optional LR scheduler and
data splits behind the trainer interface (what a checkpoint holds: docs/pytorch.md)."""

from __future__ import annotations

import copy
import hashlib
import random
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from cairn.checkpoint.options import CheckpointOptions
from cairn.config import TrainConfig
from cairn.distributed.comm import Comm, SoloComm
from cairn.errors import CairnError, ConfigError, InvariantError, TrainerCodeError
from cairn.sampler import EpochSampler
from cairn.state import Lineage, StepCallback, TrainState
from cairn.stores.base import Store
from cairn.trainers.base import DataParallelEngine, TensorSpec, Trainer, check_finite, model_hash
from cairn.trainers.pytorch.checks import (
    NON_NEGATIVE_STATE,
    check_optimizer_meta,
    check_runtime_meta,
    check_scheduler_meta,
)
from cairn.trainers.pytorch.data import DataSplit, Split
from cairn.trainers.pytorch.data_parallel import TorchDP, microbatched_update
from cairn.trainers.pytorch.setup import TorchOptions, TorchSetup
from cairn.trainers.pytorch.state_io import (
    MT_WORDS,
    RngStates,
    check_rng_json,
    check_rng_tensor,
    jsonable,
    np_dtype,
    require_numpy_dtype,
    restore_like,
    tensor_spec,
)

__all__ = ["TorchOptions", "TorchSetup", "TorchTrainer", "DataSplit"]

_PROCESS_LOCK = threading.RLock()
"""Global RNGs, thread count and deterministic mode are process-wide: one torch trainer at a time."""


class TorchTrainer(Trainer):
    """The adapter. Subclass it, set ``Options`` and implement ``build``; see the module docstring."""

    Options: ClassVar[type[BaseModel]] = TorchOptions
    options: TorchOptions

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        super().__init__(config, options)
        if not isinstance(options, TorchOptions):
            raise ConfigError("trainer.options", expected="a TorchOptions subclass", found=type(options).__name__)
        self._optim_probe: tuple[dict[str, TensorSpec], dict[str, type]] | None = None
        self._rng: RngStates | None = None
        with self.runtime():
            self._setup()
        hasher = hashlib.sha256()
        with self.user_code("hashing the data splits"):
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
    def runtime(self) -> Iterator[None]:
        with _PROCESS_LOCK:
            torch.set_num_threads(self.options.threads)
            torch.use_deterministic_algorithms(self.options.deterministic)
            yield

    @contextmanager
    def user_code(self, what: str) -> Iterator[None]:
        """The trainer's own code runs here: its failures are typed (``TrainerCodeError``, not
        retried: the same state raises again), Cairn's own errors pass through."""
        try:
            yield
        except CairnError:
            raise
        except Exception as exc:
            raise TrainerCodeError(f"{self.path}: {what} raised {type(exc).__name__}: {exc}"[:500]) from exc

    @contextmanager
    def owned_rngs(self) -> Iterator[None]:
        """Install this trainer's private RNG states in the process's global generators for the
        duration (the user's forward/backward/step draw from them), then take them back and
        restore whatever was there before: code running between updates (a save's retry jitter,
        another thread) can neither perturb the run's streams nor be perturbed by them."""
        outer = RngStates.capture()
        assert self._rng is not None
        self._rng.install()
        try:
            yield
        finally:
            self._rng = RngStates.capture()
            outer.install()

    def _setup(self) -> None:
        seed = self.config.seed
        outer = RngStates.capture()
        try:
            torch.manual_seed(seed)
            np.random.seed(seed % (1 << 32))
            random.seed(seed)
            with self.user_code("build()"):
                setup = self.build()
            self._rng = RngStates.capture()  # the run's streams start after build()
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
            name: Split(data, name)
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
            require_numpy_dtype(t, f"model tensor {name}")
        for split in self.splits.values():
            for part, data in (("x", split.x), ("y", split.y)):
                if data is not None:
                    require_numpy_dtype(data, f"{split.name} data {part}")
        self._fresh_scheduler = (
            None if self.scheduler is None else jsonable(self.scheduler.state_dict(), "scheduler.state_dict()")
        )
        self._fresh_groups = [
            {k: jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in g.items() if k != "params"}
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
        out = {f"param/{n}": tensor_spec(p) for n, p in self.params.items()}
        out.update({f"buffer/{n}": tensor_spec(b) for n, b in self.buffers.items()})
        return out

    def export_state(self, step: int, history: dict[str, list[float]], lineage: Lineage) -> TrainState:
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
                    scalars.setdefault(name, {})[key] = jsonable(value, f"optimizer.state[{name}].{key}")
        groups = []
        for i, group in enumerate(self.optimizer.param_groups):
            body = {k: jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in group.items() if k != "params"}
            groups.append({**body, "params": self.group_params[i]})
        assert self._rng is not None
        rng_tensors, rng = self._rng.to_checkpoint()
        tensors.update(rng_tensors)
        meta: dict[str, Any] = {
            "data": self.sampler.cursor_json(step),
            "optimizer": {"param_groups": groups, "with_state": with_state, "scalars": scalars},
            "scheduler": None
            if self.scheduler is None
            else jsonable(self.scheduler.state_dict(), "scheduler.state_dict()"),
            "runtime": {
                "threads": self.options.threads,
                "deterministic": self.options.deterministic,
                "torch": torch.__version__,
            },
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

    def load_state(self, state: TrainState) -> None:
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
                    group[key] = restore_like(group.get(key), value)
        if self.scheduler is not None:
            with self.user_code("scheduler.load_state_dict()"):
                self.scheduler.load_state_dict(copy.deepcopy(state.meta["scheduler"]))
        self._rng = RngStates.from_checkpoint(t, state.rng_state)

    # -- the trainer interface ---------------------------------------------------------------
    def init_state(self) -> TrainState:
        with self.runtime():
            self._setup()
            history: dict[str, list[float]] = {"loss": [], "lr": []}
            if self.eval_history:
                history.update({"val_step": [], "val_loss": [], "val_accuracy": []})
            return self.export_state(0, history, self.lineage()).copy()

    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        if steps < 0:
            raise ConfigError("steps", expected=">= 0", found=steps)
        with self.runtime():
            self.load_state(state)
            history = {k: list(v) for k, v in state.history.items()}
            step = state.step
            work = self.export_state(step, history, state.lineage)
            for _ in range(steps):
                self.advance(step, history)
                step += 1
                work = self.export_state(step, history, work.lineage)
                if on_step is not None and on_step(work):
                    break
            return work

    def advance(self, step: int, history: dict[str, list[float]], comm: Comm | None = None) -> float:
        """Update ``step + 1`` of the live objects, then the scheduler and (at an epoch end) the
        evaluation, recorded in ``history``; returns the update's loss. With a ``distributed``
        config the update is the microbatched data-parallel one (``cairn.trainers.pytorch.data_parallel``)
        over ``comm`` (this process alone when None): ``cairn train`` and a gang of any size
        compute the same bits. Its collectives run outside ``user_code`` (a peer's failure is
        the gang's, not the trainer's code's)."""
        epoch_end = (step + 1) % self.steps_per_epoch == 0
        what = f"update {step + 1}"
        with self.owned_rngs():
            if self.config.distributed is None:
                with self.user_code(what):
                    loss, lr = self._update(step)
            else:
                loss, lr = microbatched_update(self, step, SoloComm() if comm is None else comm)
            with self.user_code(what):
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
        with self.runtime():
            self.load_state(state)
            with self.owned_rngs(), self.user_code(f"evaluation on {split}"):
                return self._evaluate_live(split)

    def data_parallel(self, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> DataParallelEngine:
        """Replicated optimizer state; each rank writes its own share of every checkpoint."""
        return TorchDP(self, comm, run_id, store, options)

    def is_weight(self, name: str) -> bool:
        return name.startswith(("param/", "buffer/"))

    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        out = self._weight_specs()
        out["rng/torch"] = TensorSpec(np_dtype(torch.get_rng_state()), tuple(torch.get_rng_state().shape))
        out["rng/numpy"] = TensorSpec("<u4", (MT_WORDS,))
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
            with self.runtime():
                try:
                    self._setup()
                    for p in self.params.values():
                        if p.requires_grad:
                            p.grad = torch.zeros_like(p)
                    with self.owned_rngs(), self.user_code("optimizer.step() (probing its state)"):
                        self.optimizer.step()
                    tensors: dict[str, TensorSpec] = {}
                    scalars: dict[str, type] = {}
                    for name, p in self.params.items():
                        for key, value in self.optimizer.state.get(p, {}).items():
                            if isinstance(value, torch.Tensor):
                                tensors[f"{name}/{key}"] = tensor_spec(value)
                            else:
                                scalars[key] = type(jsonable(value, f"optimizer.state[{name}].{key}"))
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
        check_rng_json(rng)
        check_optimizer_meta(
            meta.get("optimizer"),
            step,
            self.optimizer.param_groups,
            self.group_params,
            self._fresh_groups,
            [n for n, p in self.params.items() if p.requires_grad],
            lambda: self._probe_optimizer()[1],
        )
        check_scheduler_meta(meta.get("scheduler"), self.scheduler is not None, self._fresh_scheduler)
        check_runtime_meta(meta, self.options.threads, self.options.deterministic)

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
