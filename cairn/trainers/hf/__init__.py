"""The Hugging Face trainer: any ``transformers`` causal LM built from a config (nothing is ever
downloaded), a byte-level BPE tokenizer trained on local text, and the PyTorch adapter's
checkpoints, options and hooks. Needs the ``hf`` extra."""

from cairn.trainers.hf.trainer import HFCausalLM, HFOptions

__all__ = ["HFCausalLM", "HFOptions"]
