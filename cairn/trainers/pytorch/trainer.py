"""``TorchTrainer``: an ``nn.Module``, a ``torch.optim`` optimizer, an optional LR scheduler and
data splits behind the trainer interface (what a checkpoint holds: docs/pytorch.md)."""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.tensors import TensorSpec
from cairn.config import TrainConfig
from cairn.distributed.comm import Comm, SoloComm
from cairn.errors import CairnError, ConfigError, TrainerCodeError
from cairn.sampler import EpochSampler
from cairn.state import Lineage, StepCallback, TrainState
from cairn.stores.base import Store
from cairn.trainers.base import ON_HOST, DataParallelEngine, model_hash
from cairn.trainers.pytorch.checks import (
    LEGACY_EVAL,
    changed_data_error,
    check_checkpoint_state,
    check_setup,
    check_values,
    checkpoint_specs,
)
from cairn.trainers.pytorch.data import DataSplit, Split, make_split, splits_hash
from cairn.trainers.pytorch.data_parallel import TorchDP, microbatched_update
from cairn.trainers.pytorch.device import HostStaging, device_record, resolve_device
from cairn.trainers.pytorch.evaluation import evaluate_split, record_evaluation
from cairn.trainers.pytorch.fsdp import ShardedTensors, collective_failure, default_fsdp_units, sharded_update
from cairn.trainers.pytorch.fsdp_engine import TorchFSDP
from cairn.trainers.pytorch.parts import LiveTrainer, OptimizerProbe
from cairn.trainers.pytorch.probe import probe_optimizer
from cairn.trainers.pytorch.scoring import default_metrics
from cairn.trainers.pytorch.setup import TorchOptions, TorchSetup
from cairn.trainers.pytorch.state_io import (
    RngStates,
    export_optimizer,
    from_json,
    group_param_names,
    import_whole,
    jsonable,
    scheduler_json,
    state_dict_names,
    tensor_spec,
)
from cairn.trainers.pytorch.streams import Stream
from cairn.trainers.pytorch.update import solo_update, step_scheduler

__all__ = ["TorchOptions", "TorchSetup", "TorchTrainer", "DataSplit"]

_PROCESS_LOCK = threading.RLock()
"""Global RNGs, thread count and deterministic mode are process-wide: one torch trainer at a time."""


class TorchTrainer(LiveTrainer):
    """The adapter. Subclass it, set ``Options`` and implement ``build``; see the module docstring."""

    def split_hint(self, split: str) -> str:
        return f"return a `{split}` split from your trainer's build (Setup.{split})"

    Options: ClassVar[type[BaseModel]] = TorchOptions
    options: TorchOptions

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        super().__init__(config, options)
        if not isinstance(options, TorchOptions):
            raise ConfigError("trainer.options", expected="a TorchOptions subclass", found=type(options).__name__)
        self._optim_probe: OptimizerProbe | None = None
        self._rng: RngStates | None = None
        self._metric_names: tuple[str, ...] | None = None
        self._live: TrainState | None = None  # what ``train`` returned last: views of the live objects
        self._live_step = -1
        self.shards: ShardedTensors | None = None
        """Set by an FSDP engine: export, import and update work on this rank's shards."""
        self.device = torch.device("cpu") if ON_HOST.get() else resolve_device(options.device)
        """Where the live objects are: the ``device`` option's, or the CPU for a trainer built on
        the host to read, verify or export (``load_trainer(on_host=True)``), which never trains."""
        self.staging = HostStaging(pin=self.device.type == "cuda")
        """Host buffers a device state is exported through (nothing is copied on CPU)."""
        self.device_record = device_record(self.device)
        with self.runtime():
            self._setup()
        with self.user_code("hashing the data splits"):
            self._data_hash = splits_hash(self.splits.values())
        train = self.splits["train"]
        self.sampler = EpochSampler(train.n, config.batch_size, config.seed) if isinstance(train, Split) else None
        """The seeded epoch sampler of a map-style training split (None for a stream)."""
        self.eval_history = "val" in self.splits
        self.eval_interval = self.options.eval_every or self.steps_per_epoch
        """Updates between evaluations on ``val`` (``eval_every``, or an epoch)."""

    # -- the user's part ------------------------------------------------------------------
    def build(self) -> TorchSetup:
        """Build the model, optimizer, scheduler and data (called with the RNGs seeded)."""
        raise NotImplementedError(f"{type(self).__name__}.build")

    def forward(self, x: Any) -> Any:
        """The model's output for a batch, as ``loss_fn`` and ``metrics`` take it (training and
        evaluation). Override it for a model whose forward returns more than that (a Hugging
        Face model's output object: its ``.logits``)."""
        return self.model(x)

    def compute_loss(self, x: Any, y: Any) -> torch.Tensor:
        """The training loss of one (micro)batch; runs under ``autocast``. Override it for a
        loss that is not ``loss_fn(forward(x), y)`` (auxiliary terms, a model that returns its loss)."""
        return self.setup.loss_fn(self.forward(x), y)

    def fsdp_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Under ``distributed.strategy: fsdp``, the blocks ``fully_shard`` wraps one by one
        before the whole model (default: a Hugging Face model's ``_no_split_modules``)."""
        return default_fsdp_units(model)

    def after_backward(self, step: int) -> None:
        """Called with the update's final gradients in ``.grad`` (summed over micro-steps and
        ranks, unscaled), before clipping and ``optimizer.step()`` of update ``step + 1``."""

    def metrics(self, output: Any, target: Any) -> Mapping[str, tuple[float, float]]:
        """``{name: (total, count)}`` of one evaluation batch; a split reports total / count.
        The default (``scoring.default_metrics``) scores classification and sequence outputs."""
        return default_metrics(output, target)

    def autocast(self) -> AbstractContextManager[Any]:
        """``torch.autocast`` in ``options.autocast``'s dtype (nothing when unset)."""
        dtype = self.options.autocast
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=getattr(torch, dtype))

    # -- runtime ----------------------------------------------------------------------------
    @contextmanager
    def runtime(self) -> Iterator[None]:
        with _PROCESS_LOCK:
            torch.set_num_threads(self.options.threads)
            torch.use_deterministic_algorithms(self.options.deterministic)
            yield

    @contextmanager
    def user_code(self, what: str) -> Iterator[None]:
        """The trainer's own code: its failures are ``TrainerCodeError`` (not retried), Cairn's pass."""
        try:
            yield
        except CairnError:
            raise
        except Exception as exc:
            if self.shards is not None and collective_failure(exc):
                raise  # a peer's failure under FSDP: the gang's, retried
            raise TrainerCodeError(f"{self.path}: {what} raised {type(exc).__name__}: {exc}"[:500]) from exc

    @contextmanager
    def owned_rngs(self) -> Iterator[None]:
        """Install this trainer's private RNG states in the process's global generators for the
        duration (the user's forward/backward/step draw from them), then take them back and
        restore whatever was there before: code running between updates (a save's retry jitter,
        another thread) can neither perturb the run's streams nor be perturbed by them."""
        outer = RngStates.capture(self.device)
        assert self._rng is not None
        self._rng.install()
        self.pristine = False
        try:
            yield
        finally:
            self._rng = RngStates.capture(self.device)
            outer.install()

    def _setup(self) -> None:
        seed = self.config.seed
        outer = RngStates.capture(self.device)
        try:
            torch.manual_seed(seed)  # every device's generator too
            np.random.seed(seed % (1 << 32))
            random.seed(seed)
            with self.user_code("build()"):
                setup = self.build()
            self._rng = RngStates.capture(self.device)  # the run's streams start after build()
        finally:
            outer.install()
        if not isinstance(setup, TorchSetup):
            raise ConfigError(f"{self.path}.build()", expected="a TorchSetup", found=type(setup).__name__)
        self.setup, self._live = setup, None
        tensors = [*setup.model.named_parameters(), *setup.model.named_buffers()]
        elsewhere = [f"{n} on {t.device}" for n, t in tensors if t.device.type != "cpu"]
        if elsewhere:  # Cairn places the model (and a gang rank its GPU): build it on the CPU
            raise ConfigError("TorchSetup.model", expected="built on the CPU (see 'device')", found=elsewhere[0])
        if self.device.type != "cpu":
            setup.model.to(self.device)  # the same Parameter objects: the optimizer keeps them
        self.model = setup.model
        self.optimizer = setup.optimizer
        self.scheduler = setup.scheduler
        self.plateau = isinstance(setup.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.options.grad_scaler else None
        batch = self.config.batch_size
        self.splits: dict[str, Split | Stream] = {
            name: make_split(data, name, batch)
            for name, data in (("train", setup.train), ("val", setup.val), ("test", setup.test))
            if data is not None
        }
        self.params = dict(self.model.named_parameters())
        self.buffers = dict(self.model.named_buffers())
        self.group_params = group_param_names(self.optimizer, self.params)
        check_setup(self)
        self.fresh_scheduler = scheduler_json(self.scheduler)
        self.fresh_scaler = None if self.scaler is None else jsonable(self.scaler.state_dict(), "scaler")
        self.pristine = True
        """The live objects are as ``build()`` made them (``init_state`` need not build again)."""
        self.fresh_groups = [
            {k: jsonable(v, f"optimizer.param_groups[{i}].{k}") for k, v in g.items() if k != "params"}
            for i, g in enumerate(self.optimizer.param_groups)
        ]

    # -- identity ---------------------------------------------------------------------------
    @property
    def data_hash(self) -> str:
        return self._data_hash

    def other_data_error(self, found: str, meta: Mapping[str, Any]) -> CairnError:
        """A streamed split's changed file named, when its loader records digests in the cursor."""
        return changed_data_error(self.splits["train"], meta) or super().other_data_error(found, meta)

    @property
    def steps_per_epoch(self) -> int:
        train = self.splits["train"]
        if isinstance(train, Stream):
            return self.options.epoch_steps or train.batches_per_pass or 1  # check_setup refuses neither
        return self.epoch_sampler.steps_per_epoch

    @property
    def epoch_sampler(self) -> EpochSampler:
        assert self.sampler is not None, "a map-style training split"
        return self.sampler

    @property
    def micro_steps(self) -> int:
        """The micro-steps of every update: ``distributed.microbatches`` or ``accumulation``."""
        d = self.config.distributed
        return d.microbatches if d is not None else self.options.accumulation

    def evaluations(self, step: int) -> int:
        return step // self.eval_interval if self.eval_history else 0

    def eval_metrics(self, meta: Mapping[str, Any]) -> tuple[str, ...]:
        section = meta.get("eval", LEGACY_EVAL)  # before meta.eval, the adapter kept accuracy
        names = section.get("metrics", []) if isinstance(section, Mapping) else []
        return tuple(names) if isinstance(names, list) else ()

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
            model_hash=model_hash({n: s for n, s in self.weight_specs().items()}),
            reproducibility=self.reproducibility,
        )

    # -- export / import ----------------------------------------------------------------------
    def weight_specs(self) -> dict[str, TensorSpec]:
        out = {f"param/{n}": tensor_spec(p) for n, p in self.params.items()}
        out.update({f"buffer/{n}": tensor_spec(b) for n, b in self.buffers.items()})
        return out

    def optimizer_probe(self) -> OptimizerProbe:
        """The optimizer's state as one probe step shows it (once); the RNG streams it drew from put back."""
        if self._optim_probe is None:
            kept_rng, pristine = self._rng, self.pristine
            try:
                self._optim_probe = probe_optimizer(self)
            finally:
                self._rng, self.pristine = kept_rng, pristine
        return self._optim_probe

    def export_state(self, step: int, history: dict[str, list[float]], lineage: Lineage) -> TrainState:
        """The live state as a TrainState whose arrays are zero-copy views of the live tensors (on
        a device: of the host buffers they were staged into, ``cairn.trainers.pytorch.device``)."""
        stage = self.staging.stage if self.shards is None else self.shards.prepared().stage
        tensors = {f"param/{name}": stage(f"param/{name}", p) for name, p in self.params.items()}
        tensors.update({f"buffer/{name}": stage(f"buffer/{name}", b) for name, b in self.buffers.items()})
        optimizer = export_optimizer(self.optimizer, self.params, self.group_params, tensors, stage)
        self.staging.wait()
        assert self._rng is not None
        rng_tensors, rng = self._rng.to_checkpoint()
        tensors.update(rng_tensors)
        train = self.splits["train"]
        meta: dict[str, Any] = {
            "data": {"stream": train.state(), "batches": step}
            if isinstance(train, Stream)
            else self.epoch_sampler.cursor_json(step),
            "optimizer": optimizer,
            "scheduler": scheduler_json(self.scheduler),
            "runtime": {
                "threads": self.options.threads,
                "deterministic": self.options.deterministic,
                "torch": torch.__version__,
                **self.device_record,
                **({} if self.shards is None else {"sharding": self.shards.record()}),
            },
        }
        if self.scaler is not None:
            meta["scaler"] = jsonable(self.scaler.state_dict(), "scaler.state_dict()")
        if self.eval_history:
            meta["eval"] = {"metrics": list(self._metric_names or ())}
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

    def load_state(self, state: TrainState, *, owned: bool = False) -> None:
        """Make the live objects hold ``state`` in fresh storage (nothing the caller holds aliases
        them), or, when ``owned`` and sharded, in the arrays' own (``LiveTrainer.load_state``)."""
        t = state.tensors
        self.pristine, self._live = False, None
        if self.shards is not None:  # this rank's shards into the sharded model
            self.shards.install(t, state.meta["optimizer"], owned=owned)
        else:
            import_whole(self.optimizer, self.params, self.buffers, t, state.meta["optimizer"], self.device)
        if self.scheduler is not None:
            with self.user_code("scheduler.load_state_dict()"):
                self.scheduler.load_state_dict(from_json(copy.deepcopy(state.meta["scheduler"]), "meta.scheduler"))
        if self.scaler is not None:
            self.scaler.load_state_dict(copy.deepcopy(state.meta["scaler"]))
        train = self.splits["train"]
        if isinstance(train, Stream):
            with self.user_code("the training stream's load_state_dict()"):
                train.load(state.meta["data"]["stream"])
        if self.eval_history:
            self._metric_names = self.eval_metrics(state.meta) or None
        self._rng = RngStates.from_checkpoint(t, state.rng_state, self.device)

    # -- the trainer interface ---------------------------------------------------------------
    def init_state(self) -> TrainState:
        with self.runtime():
            if not self.pristine:
                self._setup()
            history: dict[str, list[float]] = {"loss": [], "lr": []}
            if self.eval_history:
                history.update({"val_step": [], "val_loss": []})
                self._metric_names = None
            return self.export_state(0, history, self.lineage()).copy()

    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        if steps < 0:
            raise ConfigError("steps", expected=">= 0", found=steps)
        self.require_placed()
        with self.runtime():
            if state is not self._live or state.step != self._live_step:
                self.load_state(state)  # else: the live objects are ``state`` (a warm segment)
            history = {k: list(v) for k, v in state.history.items()}
            step = state.step
            work = self.export_state(step, history, state.lineage)
            for _ in range(steps):
                before = work.copy() if self.evaluations(step + 1) > self.evaluations(step) else None
                try:
                    self.advance(step, history)
                except TrainerCodeError as exc:
                    exc.trained = before  # an evaluation failed: the state before its update is whole
                    raise
                step += 1
                work = self.export_state(step, history, work.lineage)
                if on_step is not None and on_step(work):
                    break
            self._live, self._live_step = work, step
            return work

    def advance(self, step: int, history: dict[str, list[float]], comm: Comm | None = None) -> float:
        """Update ``step + 1`` of the live objects, then the scheduler and (every
        ``eval_interval`` updates) the evaluation, recorded in ``history``; returns the update's
        loss. With micro-steps the update is the microbatched one over ``comm`` (this process
        alone when None; ``data_parallel``), or FSDP's (``fsdp``). Collectives run outside
        ``user_code`` (a peer's failure is the gang's)."""
        epoch_end = (step + 1) % self.steps_per_epoch == 0
        what, self._live = f"update {step + 1}", None
        with self.owned_rngs():
            if self.shards is not None:
                loss, lr = sharded_update(self, step, SoloComm() if comm is None else comm)
            elif self.config.distributed is None and self.micro_steps == 1:
                with self.user_code(what):
                    loss, lr = solo_update(self, step)
            else:
                loss, lr = microbatched_update(self, step, SoloComm() if comm is None else comm)
            with self.user_code(what):
                every = self.options.scheduler_interval == "step" or epoch_end
                if self.scheduler is not None and not self.plateau and every:
                    step_scheduler(self)
            metrics = None
            if self.evaluations(step + 1) > self.evaluations(step):
                with self.user_code(f"evaluation after update {step + 1}"):
                    metrics = evaluate_split(self, "val")
                    if self.plateau:
                        step_scheduler(self, metrics["loss"])
        history["loss"].append(loss)
        history["lr"].append(lr)
        if metrics is not None:
            self._metric_names = record_evaluation(self._metric_names, step + 1, metrics, history)
        return loss

    def evaluate(self, state: TrainState, split: str) -> dict[str, float] | None:
        if split not in self.splits or split == "train":
            return None
        with self.runtime():
            self.load_state(state)
            with self.owned_rngs(), self.user_code(f"evaluation on {split}"):
                return evaluate_split(self, split)

    def data_parallel(self, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> DataParallelEngine:
        """``distributed.strategy``: replicated (``TorchDP``) or fsdp (``TorchFSDP``)."""
        self.require_placed()
        fsdp = self.config.distributed is not None and self.config.distributed.strategy == "fsdp"
        return (TorchFSDP if fsdp else TorchDP)(self, comm, run_id, store, options)

    def require_placed(self) -> None:
        if self.device.type == "cpu" and self.options.device != "cpu":
            raise ConfigError(
                "trainer.options.device",
                expected="a trainer placed on its device to train",
                found="one built on the host to read",
            )

    def is_weight(self, name: str) -> bool:
        return name.startswith(("param/", "buffer/"))

    def exchange_names(self) -> tuple[dict[str, str], dict[str, str]]:
        return state_dict_names(self.model, self.params, self.buffers)

    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        return checkpoint_specs(self, meta)

    def check_state(self, step: int, cursor: int, rng: Any, meta: Mapping[str, Any]) -> None:
        self.check_cursor(step, cursor)
        check_checkpoint_state(self, step, rng, meta)

    def check_values(self, name: str, values: np.ndarray) -> None:
        check_values(name, values)
