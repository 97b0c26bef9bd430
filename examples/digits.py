"""A small CNN on the 8x8 digits images that ship inside the scikit-learn wheel (1,797 images;
nothing downloads), trained through Cairn's PyTorch adapter.

Use it as the template for your own model: a ``TorchOptions`` subclass is your config
section, ``build`` returns the model, optimizer, scheduler and data splits. Run it with
``cairn train --config examples/digits.json --steps 200 --store ./ckpts`` or on Temporal with
``cairn run start examples/digits-run.json``.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from sklearn.datasets import load_digits
from torch import nn

from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer

__all__ = ["DigitsOptions", "DigitsCNN", "digits_splits"]


class DigitsOptions(TorchOptions):
    lr: float = Field(default=2e-3, gt=0, le=1)
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    channels: int = Field(default=8, ge=1, le=256)
    hidden: int = Field(default=64, ge=1, le=4096)
    epochs_for_schedule: int = Field(default=10, ge=1, le=10_000)
    """The cosine schedule's length in epochs."""
    val_fraction: float = Field(default=0.15, ge=0, lt=0.5)
    test_fraction: float = Field(default=0.15, ge=0, lt=0.5)
    split_seed: int = Field(default=0, ge=0)


def digits_splits(val_fraction: float, test_fraction: float, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Train/val/test splits of the digits images by one seeded permutation."""
    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)  # N x 1 x 8 x 8
    y = torch.from_numpy(digits.target.astype(np.int64))
    n = len(y)
    order = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0xD161]))).permutation(n)
    n_test, n_val = int(n * test_fraction), int(n * val_fraction)
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {name: (x[torch.from_numpy(idx)], y[torch.from_numpy(idx)]) for name, idx in parts.items() if idx.size}


class DigitsNet(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * channels * 16, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsCNN(TorchTrainer):
    """Conv-BN-ReLU-Conv-ReLU-Pool-Dropout-MLP with AdamW and a cosine schedule."""

    Options = DigitsOptions
    options: DigitsOptions

    def build(self) -> TorchSetup:
        o = self.options
        splits = digits_splits(o.val_fraction, o.test_fraction, o.split_seed)
        model = DigitsNet(o.channels, o.hidden)
        optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
        steps_per_epoch = len(splits["train"][1]) // self.config.batch_size
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=o.epochs_for_schedule * steps_per_epoch)
        return TorchSetup(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train=splits["train"],
            val=splits.get("val"),
            test=splits.get("test"),
            version=f"digits-cnn-v1-c{o.channels}-h{o.hidden}",
            data_version="sklearn-digits-v1",
        )
