"""Tiny pretrained Hugging Face directories built here (the fine-tuning example's
``save_base``: ``save_pretrained`` of a tiny Llama or Qwen2 and a byte-level BPE tokenizer trained
once on local text): nothing downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cairn.config import TrainConfig, parse_config
from examples.finetune import save_base

TINY: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
        "tie_word_embeddings": True,
    },
}


def save_pretrained_dir(
    path: Path,
    arch: str = "llama",
    *,
    vocab: int = 300,
    tokenizer_vocab: int = 300,
    shard: str | None = None,
    arch_fields: dict[str, Any] | None = None,
) -> Path:
    """A pretrained directory at ``path`` (``examples.finetune.save_base``): a tiny ``arch`` model
    (``TINY``'s fields unless ``arch_fields``) and its tokenizer."""
    return save_base(
        path, arch, fields=arch_fields or TINY[arch], vocab=vocab, tokenizer_vocab=tokenizer_vocab, shard=shard
    )


def pretrained_config(path: Path, seed: int = 17, **options: Any) -> TrainConfig:
    """``HFCausalLM`` fine-tuning the directory at ``path`` on a few KB of text."""
    body = {"pretrained": str(path), "context": 16, "corpus_bytes": 6000, "eval_every": 10, "eval_batch_size": 64}
    body.update(options)
    trainer = {"factory": "cairn.trainers.hf:HFCausalLM", "options": body}
    return parse_config({"seed": seed, "batch_size": 8, "trainer": trainer})
