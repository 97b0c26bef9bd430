"""A small MLP on the 8x8 digits images that ship inside scikit-learn (nothing downloads)."""

import torch
from sklearn.datasets import load_digits
from torch import nn

from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 images, each 64 pixels in [0, 1], and their labels 0-9."""
    images, labels = load_digits(return_X_y=True)
    return torch.tensor(images / 16.0, dtype=torch.float32), torch.tensor(labels)


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


class MLPOptions(TorchOptions):  # the config's trainer.options, validated
    lr: float = 0.01
    hidden: int = 32


class DigitsMLP(TorchTrainer):
    Options = MLPOptions
    options: MLPOptions

    def build(self) -> TorchSetup:  # called with torch, numpy and random seeded from the config's seed
        x, y = digits()
        model = make_model(self.options.hidden)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.options.lr)
        return TorchSetup(
            model=model,
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.5),
            train=(x[:1500], y[:1500]),  # 1,500 images to learn from: an epoch is 30 batches of 50
            val=(x[1500:], y[1500:]),  # 297 held out, evaluated at the end of every epoch
            version="digits-mlp-v1",
            data_version="sklearn-digits",
        )
