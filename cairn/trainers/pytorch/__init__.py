"""The PyTorch adapter: bring an ``nn.Module``, a ``torch.optim`` optimizer, an optional LR
scheduler and a dataset; get full-state checkpoints, validated import and bit-exact resume.
Needs the torch extra.

Modules: ``trainer`` (the adapter behind the trainer interface), ``parts`` (what the other
modules see of it), ``setup`` (its options and what the user's build returns), ``data`` (splits and
loaders), ``streams`` (resumable streams), ``records`` (files larger than memory, as a stream),
``update`` (one optimizer update), ``evaluation`` (loss and metrics for any model), ``scoring`` (a
batch scored by default), ``probe`` (the optimizer's state, learnt), ``state_io`` (its state in
checkpoint form), ``checks`` (what a checkpoint must hold to fit this setup), ``device`` (placement
and host staging), ``schedules`` (learning-rate schedules), ``data_parallel`` (its engine over any
world size), ``fsdp`` (the model sharded with FSDP2: its update and its state as shards),
``fsdp_engine`` (the sharded engine and its checkpoint layout)."""

from cairn.trainers.pytorch.setup import TorchOptions, TorchSetup
from cairn.trainers.pytorch.trainer import TorchTrainer

__all__ = ["TorchOptions", "TorchSetup", "TorchTrainer"]
