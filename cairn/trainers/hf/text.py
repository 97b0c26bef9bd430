"""Text for a causal LM that every machine has: the corpus (the user's files, or the Python
standard library's own sources), a byte-level BPE tokenizer trained on it, and the token
windows a model trains on. Deterministic: the same files give the same tokenizer and windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cairn.corpus import read_texts, stdlib_paths
from cairn.errors import ConfigError

__all__ = ["EOS", "read_corpus", "token_windows", "train_tokenizer"]

EOS = "<|endoftext|>"
"""The one special token: end of text (also the model's bos/eos id)."""


def read_corpus(files: list[str], limit: int, separator: str = EOS) -> str:
    """At most ``limit`` bytes of text: the files in order (the standard library's sources when
    ``files`` is empty), joined by ``separator`` (a pretrained tokenizer's own end of text)."""
    paths = [Path(f) for f in files] or stdlib_paths()
    for i, path in enumerate(paths if files else []):
        if not path.is_file():
            raise ConfigError(f"trainer.options.corpus[{i}]", expected="a readable text file", found=str(path))
    return separator.join(data.decode("utf-8", errors="replace") for data in read_texts(paths, limit))


def train_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's scheme: every byte is a token, merges on top) of
    ``vocab_size`` tokens trained on ``text``; the same text gives the same tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


def token_windows(tokenizer: Tokenizer, text: str, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of ``context + 1`` tokens: inputs and next-token targets."""
    ids = np.asarray(tokenizer.encode(text).ids, dtype=np.int64)
    n = ids.size // (context + 1)
    if n < 4:
        raise ConfigError(
            "trainer.options.corpus_bytes", expected=f"text for >= {4 * (context + 1)} tokens", found=int(ids.size)
        )
    windows = torch.from_numpy(ids[: n * (context + 1)].reshape(n, context + 1))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
