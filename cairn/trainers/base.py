"""The trainer interface: what the durable machinery needs from any trainer (``Trainer``, whose
``tensor_specs`` an import is checked against), and the one way a gang reaches a trainer
(``DataParallelEngine``, built by ``Trainer.data_parallel``). Contract: README, "Bring your own
model"."""

from __future__ import annotations

import hashlib
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from cairn.checkpoint.tensors import TensorSpec
from cairn.config import TrainConfig
from cairn.errors import CairnError, ConfigError, IncompatibleConfigError, InvariantError, NonFiniteError
from cairn.state import HISTORY_KEYS, Lineage, StepCallback, TrainState

if TYPE_CHECKING:
    from cairn.checkpoint.manifest import Manifest
    from cairn.checkpoint.options import CheckpointOptions
    from cairn.checkpoint.ref import CheckpointRef
    from cairn.distributed.checkpoint import SaveOutcome
    from cairn.distributed.comm import Comm
    from cairn.stores.base import Store

__all__ = [
    "Trainer",
    "DataParallelEngine",
    "NoOptions",
    "StepCallback",
    "STEP_HISTORY",
    "EVAL_HISTORY",
    "model_hash",
    "check_finite",
    "ON_HOST",
]

ON_HOST: ContextVar[bool] = ContextVar("cairn_trainer_on_host", default=False)
"""True while ``load_trainer(..., on_host=True)`` builds a trainer: one that reads, verifies,
exports or describes (a checkpoint, a config) and never trains, so a GPU trainer stays on the
CPU and needs no GPU."""

STEP_HISTORY = HISTORY_KEYS
"""History kept per update: one value per step (``loss``, ``lr``)."""
EVAL_HISTORY = ("val_step", "val_loss", "val_accuracy")
"""History kept per evaluation on the validation split (at each epoch end) by the built-in MLP;
another trainer keeps ``val_step``, ``val_loss`` and one ``val_<name>`` per ``eval_metrics``."""


class NoOptions(BaseModel):
    """A trainer without options of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def model_hash(specs: Mapping[str, TensorSpec]) -> str:
    """sha256 over tensor names, dtypes and shapes: the architecture, not the values."""
    body = sorted([name, s.dtype, list(s.shape)] for name, s in specs.items())
    return "sha256:" + hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


class DataParallelEngine(Protocol):
    """One rank's share of a data-parallel run of a trainer: what a gang rank drives. Every rank
    calls the methods in the same order; each collective failure is agreed by all ranks."""

    @property
    def trainer(self) -> Trainer:
        """The trainer whose arithmetic the engine runs (its value rules check every block)."""

    state: TrainState | None
    """The rank's view of the run's state (the same object across updates)."""

    def start_fresh(self) -> None:
        """Step 0: every rank builds the same seeded state."""

    def load(self, ref: CheckpointRef) -> Manifest:
        """The coordinated restore of ``ref`` onto this world size (validated on every rank)."""

    def step(self) -> float:
        """One update; returns its loss (the same on every rank)."""

    def save(self) -> SaveOutcome:
        """A coordinated checkpoint of the current step."""


class Trainer(ABC):
    """One model, optimizer and data pipeline, driven by Cairn. See the module docstring."""

    Options: ClassVar[type[BaseModel]] = NoOptions
    """The trainer's own config section (``TrainConfig.trainer.options``), validated on load."""

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        self.config = config
        self.options = options
        self.eval_history = False
        """Whether states carry ``EVAL_HISTORY`` (the trainer has a validation split)."""

    # -- identity ------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.config.trainer_path

    @property
    @abstractmethod
    def data_hash(self) -> str:
        """Content hash of the data this run trains on (checked against a checkpoint's lineage)."""

    def other_data_error(self, found: str, meta: Mapping[str, Any]) -> CairnError:
        """The refusal of a checkpoint whose lineage's dataset hash (``found``) is not this run's
        ``data_hash``. A trainer that records more of its data in a state's ``meta`` (the PyTorch
        adapter: a streamed file's digest) names what changed; this one says the data differs."""
        return IncompatibleConfigError(
            "checkpoint was trained on different data",
            field="lineage.dataset_hash",
            expected=self.data_hash,
            found=found,
        )

    @property
    @abstractmethod
    def steps_per_epoch(self) -> int:
        """Updates per epoch (``segment.epochs`` is sized in these)."""

    @property
    def reproducibility(self) -> str:
        """``bit-exact`` (same build, same thread count) or ``tolerance``."""
        return "bit-exact"

    def lineage(self) -> Lineage:
        """The lineage of a fresh state of this trainer."""
        c = self.config
        return Lineage(
            dataset_version=c.data.version,
            dataset_hash=self.data_hash,
            model_version=c.model.version,
            tokenizer_version=c.tokenizer_version,
            stage_contract=c.stage,
        )

    # -- state ---------------------------------------------------------------------------
    @abstractmethod
    def init_state(self) -> TrainState:
        """Step 0, from the config and its seed."""

    @abstractmethod
    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        """Apply ``steps`` updates; ``state`` is not modified. ``on_step`` sees the working state
        after each update (it must copy what it keeps) and may return True to stop early."""

    @abstractmethod
    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        """The tensors (history excluded) a checkpoint of this model at ``step`` must hold."""

    @abstractmethod
    def check_state(self, step: int, cursor: int, rng: Any, meta: Mapping[str, Any]) -> None:
        """Cross-field invariants of a checkpoint's JSON part; raise ``InvariantError``."""

    def check_cursor(self, step: int, cursor: int) -> None:
        """The data cursor counts the examples drawn: ``step x batch_size``."""
        if cursor != step * self.config.batch_size:
            raise InvariantError(
                "data cursor must equal step x batch_size",
                field="cursor",
                expected=step * self.config.batch_size,
                found=cursor,
            )

    @abstractmethod
    def is_weight(self, name: str) -> bool:
        """Whether tensor ``name`` is part of the model's weights (what ``weights_only`` and
        ``init_from`` keep): parameters and buffers, not optimizer state."""

    def exchange_names(self) -> tuple[dict[str, str], dict[str, str]]:
        """The weights under the names other tools know them by (a safetensors file's keys) ->
        checkpoint names, and aliases: further keys that name one of those tensors (tied
        weights). The default: the checkpoint's own names, no aliases."""
        return {n: n for n in self.tensor_specs(0, {}) if self.is_weight(n)}, {}

    def exchange_files(self) -> dict[str, bytes] | None:
        """The files that make an export of the weights a directory other tools load (a Hugging
        Face model's ``config.json`` and tokenizer), by file name; None: a weights-only export."""
        return None

    def weights_only(self, state: TrainState) -> TrainState:
        """Keep the weights, reset everything else (moments, step, RNG, cursor, history).

        This is what "restoring from weights" gives: the forward function, not training.
        """
        fresh = self.init_state()
        for name, arr in state.tensors.items():
            if self.is_weight(name):
                fresh.tensors[name] = np.array(arr, copy=True)
        return fresh

    def evaluate(self, state: TrainState, split: str) -> dict[str, float] | None:
        """Loss and metrics (accuracy, ...) of ``state`` on ``split`` (``val`` or ``test``);
        None if the trainer has no such split."""
        return None

    def split_hint(self, split: str) -> str:
        """How a run of this trainer holds ``split`` out, for the refusal of an evaluation on a
        split it does not have (the built-in MLP: a fraction of its dataset)."""
        return f"set data.{split}_fraction"

    def evaluations(self, step: int) -> int:
        """How many evaluations a state at ``step`` has recorded (one at every epoch end)."""
        return step // self.steps_per_epoch if self.eval_history else 0

    def eval_metrics(self, meta: Mapping[str, Any]) -> tuple[str, ...]:
        """The metrics besides ``val_loss`` recorded at every evaluation of a state whose JSON
        part is ``meta`` (history ``val_<name>``)."""
        return ("accuracy",)

    def check_values(self, name: str, values: np.ndarray) -> None:
        """Value rules for (a chunk of) one tensor: floats must be finite everywhere."""
        check_finite(name, values)

    def data_parallel(self, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> DataParallelEngine:
        """This trainer's engine for one rank of a gang (needs a ``distributed`` config)."""
        raise ConfigError("trainer.factory", expected="the built-in MLP or a PyTorch adapter trainer", found=self.path)


_INFINITY_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80}
"""The bits of +infinity of each 16-bit float (IEEE half; bfloat16, float32's upper half), by dtype
name: a value is finite iff its magnitude's bits are below them."""
_BITS_BLOCK = 1 << 17
"""16-bit values tested at a time, through a scratch of 256 KiB of the calling thread's own
(restores check tensors on several threads at once), allocated once per thread."""
_scratch = threading.local()


def _non_finite_16(values: np.ndarray, infinity: int) -> int:
    """How many values of a 16-bit float array are NaN or infinite: exact, on their bits."""
    bits = values.reshape(-1).view(np.uint16)
    scratch: np.ndarray | None = getattr(_scratch, "bits", None)
    if scratch is None:
        scratch = _scratch.bits = np.empty(_BITS_BLOCK, dtype=np.uint16)
    bad = 0
    for start in range(0, bits.size, _BITS_BLOCK):
        part = bits[start : start + _BITS_BLOCK]
        magnitude = np.bitwise_and(part, 0x7FFF, out=scratch[: part.size])
        if int(magnitude.max()) >= infinity:
            bad += int(np.count_nonzero(magnitude >= infinity))
    return bad


def check_finite(name: str, values: np.ndarray) -> None:
    """Floating-point values (bfloat16 included) must be finite. A 16-bit float is finite iff the
    bits of its magnitude are below those of infinity (an exact integer test, no conversion);
    a wider one is proved finite by one cheap sum, the exact (allocating) test running only
    when the sum is not finite (or overflowed)."""
    infinity = _INFINITY_BITS.get(values.dtype.name) if values.dtype.isnative else None
    if infinity is not None:
        bad = _non_finite_16(values, infinity)
        finite = bad == 0
    elif values.dtype.kind == "f":
        with np.errstate(all="ignore"):  # a signalling NaN or an overflowing sum: the typed error alone says so
            finite = bool(np.isfinite(values.sum())) or bool(np.isfinite(values).all())
            bad = 0 if finite else int(values.size - np.count_nonzero(np.isfinite(values)))
    else:
        return
    if not finite:
        raise NonFiniteError(
            "tensor holds NaN or infinity", field=f"tensors[{name}]", expected="finite", found=f"{bad} non-finite"
        )
