"""A small GPT-style byte-level language model on text every machine has: the Python standard
library's own sources. AdamW with two parameter groups (no weight decay on biases, norms and
embeddings), tied input/output embeddings, dropout, warmup + cosine, gradient clipping,
accumulation and bf16 autocast come from the adapter's options. The training split can be a
resumable stream (``streaming``) whose position rides in every checkpoint.

Run it: ``cairn train --config examples/lm.json --store ./ckpt --steps 200``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn
from torch.utils.data import IterableDataset

from cairn.corpus import read_texts, stdlib_paths
from cairn.errors import ConfigError
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer
from cairn.trainers.pytorch.schedules import warmup_cosine

__all__ = ["ByteLM", "LMOptions", "TextStream", "TinyGPT", "corpus_windows"]


class LMOptions(TorchOptions):
    context: int = Field(default=64, ge=2, le=4096)
    width: int = Field(default=64, ge=8, le=4096)
    heads: int = Field(default=4, ge=1, le=64)
    layers: int = Field(default=2, ge=1, le=64)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    lr: float = Field(default=3e-3, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    warmup: int = Field(default=20, ge=0)
    """Updates of linear warmup; then a cosine decay to 10% over ``decay_steps``."""
    decay_steps: int = Field(default=1000, ge=1)
    corpus_bytes: int = Field(default=120_000, ge=1024, le=1 << 26)
    val_fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    streaming: bool = False
    """Train from ``TextStream`` (a resumable IterableDataset) instead of a map-style split."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Keep the parameters (and so AdamW's moments) in this dtype."""


def corpus_windows(context: int, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of ``context + 1`` bytes of the corpus: inputs and next-byte targets."""
    raw = np.frombuffer(b"".join(read_texts(stdlib_paths(), limit)), dtype=np.uint8)
    n = raw.size // (context + 1)
    if n < 4:
        raise ConfigError("corpus_bytes", expected=f">= {4 * (context + 1)} bytes of text", found=raw.size)
    windows = torch.from_numpy(raw[: n * (context + 1)].astype(np.int64).reshape(n, context + 1))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class TextStream(IterableDataset):  # type: ignore[type-arg]
    """The training windows as a stream: a seeded permutation per pass, read in order. Its
    position (pass and index) is its state, so a resumed run continues the stream exactly."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
        self.x, self.y, self.seed = x, y, seed
        self.epoch, self.index = 0, 0

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self))
        while self.index < len(self):
            i = int(order[self.index])
            self.index += 1
            yield self.x[i], self.y[i]
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, pre-norm transformer blocks, a head tied to the embedding."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t)))
        mask = self.mask[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))  # B x T x vocab


class ByteLM(TorchTrainer):
    Options = LMOptions
    options: LMOptions

    def build(self) -> TorchSetup:
        o = self.options
        if o.width % o.heads:
            raise ConfigError("trainer.options.width", expected=f"a multiple of heads ({o.heads})", found=o.width)
        x, y = corpus_windows(o.context, o.corpus_bytes)
        n_val = max(1, int(x.shape[0] * o.val_fraction))
        train_x, train_y, val_x, val_y = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
        model = TinyGPT(256, o.context, o.width, o.heads, o.layers, o.dropout)
        if o.param_dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (decay if p.ndim >= 2 and not name.startswith(("tok.", "pos.")) else no_decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o.lr,
            betas=(0.9, 0.95),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(o.warmup, o.decay_steps))
        train: Any = (train_x, train_y)
        if o.streaming:
            train = TextStream(train_x, train_y, self.config.seed)
        return TorchSetup(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train=train,
            val=(val_x, val_y),
            version=f"byte-gpt-{o.layers}x{o.width}-ctx{o.context}-{o.param_dtype}",
            data_version="python-stdlib-sources-v1",
        )
