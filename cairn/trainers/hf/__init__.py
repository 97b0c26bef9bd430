"""The Hugging Face trainer: any ``transformers`` causal LM built from a config (nothing is ever
downloaded), a byte-level BPE tokenizer trained on local text, and the PyTorch adapter's
checkpoints, options and hooks. Needs the hf extra.

Modules: ``trainer`` (the causal LM behind the trainer interface), ``text`` (the corpus, a
byte-level BPE tokenizer trained on it, the token windows)."""

from cairn.trainers.hf.trainer import HFCausalLM, HFOptions

__all__ = ["HFCausalLM", "HFOptions"]
