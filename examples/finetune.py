"""The fine-tuning example's inputs, made here from nothing that downloads: a small pretrained
causal LM directory (a Llama-style model saved with ``save_pretrained``, with a byte-level BPE
tokenizer trained on the Python standard library's own sources) and an instruction file in
JSONL. A real fine-tune points ``trainer.options.pretrained`` at the user's own directory and
``trainer.options.data.files`` at their own JSONL; everything else is the same.

    python -m examples.finetune base ./base             # the pretrained directory
    python -m examples.finetune data ./instructions.jsonl

``examples/finetune.json`` (full fine-tune) and ``examples/finetune-lora.json`` (LoRA, rank 8)
are the trainer configs; ``examples/finetune-run.json`` runs the LoRA one on Temporal.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["LLAMA", "instructions", "save_base"]

LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
"""The example's base model: a Llama of about 80 k parameters."""


@functools.cache
def _tokenizer_json(vocab_size: int) -> str:
    from cairn.trainers.hf.text import read_corpus, train_tokenizer

    return str(train_tokenizer(read_corpus([], 20_000), vocab_size).to_str())


def save_base(
    path: Path,
    arch: str = "llama",
    *,
    fields: dict[str, Any] | None = None,
    vocab: int = 300,
    tokenizer_vocab: int = 300,
    shard: str | None = None,
    seed: int = 1234,
) -> Path:
    """A pretrained directory at ``path``: an ``arch`` model (``fields`` of its config, default
    ``LLAMA``; ``vocab`` embedding rows; weights seeded by ``seed``) saved with ``save_pretrained``
    (sharded at ``shard``), and its tokenizer (``tokenizer_vocab`` tokens)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from cairn.trainers.hf.text import EOS

    tokenizer = Tokenizer.from_str(_tokenizer_json(tokenizer_vocab))
    eos = tokenizer.token_to_id(EOS)
    config = AutoConfig.for_model(arch, vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, **(fields or LLAMA))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS)
    fast.save_pretrained(path)
    return path


def instructions(path: Path, n: int = 400) -> Path:
    """``n`` instruction records (``prompt``, ``response``): small sums and their answers."""
    with path.open("w") as out:
        for i in range(n):
            a, b = i % 37, (i * 7) % 23
            out.write(json.dumps({"prompt": f"What is {a} plus {b}?", "response": f"{a} plus {b} is {a + b}."}) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.finetune", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("base", "data"))
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    made = save_base(args.path) if args.what == "base" else instructions(args.path)
    print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
