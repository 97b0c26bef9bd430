"""The PyTorch adapter: bring an ``nn.Module``, a ``torch.optim`` optimizer, an optional LR
scheduler and a dataset; get full-state checkpoints, validated import and bit-exact resume.

``trainer`` is the adapter behind the trainer interface; ``data_parallel`` its engine over any
world size. Needs the ``torch`` extra."""

from cairn.trainers.pytorch.setup import TorchOptions, TorchSetup
from cairn.trainers.pytorch.trainer import TorchTrainer

__all__ = ["TorchOptions", "TorchSetup", "TorchTrainer"]
