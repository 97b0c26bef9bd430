"""The Hugging Face trainer: any ``transformers`` causal LM built from a config with a byte-level
BPE tokenizer trained on local text, or read from a local pretrained directory with its own
tokenizer, optionally with LoRA adapters on the frozen base (nothing is ever downloaded), and the
PyTorch adapter's checkpoints, options and hooks. Needs the hf extra.

Modules: ``trainer`` (the causal LM behind the trainer interface), ``text`` (the corpus, a
byte-level BPE tokenizer trained on it, the token windows), ``pretrained`` (a pretrained
directory's config, tokenizer and validated weights), ``lora`` (LoRA adapters: options, the
wrapped model, the adapter and merged exports)."""

from cairn.trainers.hf.trainer import HFCausalLM, HFOptions

__all__ = ["HFCausalLM", "HFOptions"]
