"""A pretrained Hugging Face directory read for fine-tuning: its ``config.json`` (local files
only, never remote code), its tokenizer from its own files (never retrained), and its weights
through the validated safetensors import (``cairn.interop.weights``: headers under limits, the
key set, dtypes, shapes, values, tied weights). Config, tokenizer and weights must agree; the
directory's content hash names what was read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, PretrainedConfig, PreTrainedTokenizerFast

from cairn.errors import ConfigError
from cairn.interop import read_weights
from cairn.trainers.pytorch.checks import check_values
from cairn.trainers.pytorch.state_io import from_numpy, state_dict_names, to_numpy

__all__ = ["FIELD", "TOKENIZER_FILES", "PretrainedSource", "load_pretrained_weights", "read_pretrained"]

FIELD = "trainer.options.pretrained"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)
"""The files of the directory besides config and weights that the content hash covers and an
export carries (those present): the tokenizer's, and the generation defaults."""
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class PretrainedSource:
    """What a pretrained directory gives before its weights are read."""

    path: Path
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerFast
    dtype: torch.dtype
    """The dtype its weights are stored in (``config.json``'s ``dtype``; float32 when unsaid)."""
    files: dict[str, bytes]
    """Its tokenizer (and generation) files, as read (``TOKENIZER_FILES``)."""

    @property
    def backend(self) -> Tokenizer:
        """The ``tokenizers`` tokenizer its ``tokenizer.json`` describes."""
        return self.tokenizer.backend_tokenizer

    @property
    def separator(self) -> str:
        """What joins corpus files: the tokenizer's end-of-text token (a newline without one)."""
        eos = self.tokenizer.eos_token
        return eos if isinstance(eos, str) and eos else "\n"


def read_pretrained(path_text: str) -> PretrainedSource:
    """The config and tokenizer of the directory ``path_text``, checked against each other (the
    tokenizer's vocabulary fits the model's); refusals are one ``ConfigError`` line."""
    path = Path(path_text).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(FIELD, expected="a Hugging Face directory with config.json", found=str(path))
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(
            f"{FIELD}: tokenizer.json", expected="the model's fast tokenizer (tokenizer.json)", found="absent"
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{FIELD}: config.json", expected="a transformers config", found=_line(exc)) from None
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # tokenizers raises its own untyped errors
        raise ConfigError(f"{FIELD}: tokenizer.json", expected="a tokenizer file", found=_line(exc)) from None
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or len(tokenizer) > vocab:
        raise ConfigError(
            f"{FIELD}: tokenizer.json: the tokenizer's vocabulary is larger than the model's",
            expected=f"at most {vocab} tokens (config.json vocab_size)",
            found=f"{len(tokenizer)} tokens",
        )
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
    name = str(stored).removeprefix("torch.")
    if name not in FLOAT_DTYPES:
        raise ConfigError(f"{FIELD}: config.json dtype", expected=sorted(FLOAT_DTYPES), found=name)
    files = {n: (path / n).read_bytes() for n in TOKENIZER_FILES if (path / n).is_file()}
    return PretrainedSource(path, config, tokenizer, FLOAT_DTYPES[name], files)


class _Exchange:
    """The model as the safetensors import sees it (``WeightExchange``), before the trainer exists."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.buffers = dict(model.named_buffers())
        self.model = model

    def exchange_names(self) -> tuple[dict[str, str], dict[str, str]]:
        return state_dict_names(self.model, self.params, self.buffers)

    def exchange_files(self) -> dict[str, bytes] | None:
        return None

    def check_values(self, name: str, values: np.ndarray) -> None:
        check_values(name, values)

    def fresh(self) -> dict[str, np.ndarray]:
        out = {f"param/{n}": to_numpy(p) for n, p in self.params.items()}
        out.update({f"buffer/{n}": to_numpy(b) for n, b in self.buffers.items()})
        return out


def load_pretrained_weights(source: PretrainedSource, model: torch.nn.Module) -> str:
    """Put the directory's weights into ``model`` (built from its config, in its stored dtype),
    every check of the validated import first; returns the directory's content hash (weights,
    index, config and ``TOKENIZER_FILES``)."""
    exchange = _Exchange(model)
    side = ("config.json", *TOKENIZER_FILES)
    imported = read_weights(source.path, exchange, exchange.fresh(), field=FIELD, side_files=side)
    with torch.no_grad():
        for name, arr in imported.arrays.items():
            kind, _, key = name.partition("/")
            target = exchange.params[key] if kind == "param" else exchange.buffers[key]
            target.copy_(from_numpy(arr))
    return imported.content_hash


def _line(exc: Any) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
