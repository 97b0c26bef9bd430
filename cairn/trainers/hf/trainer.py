"""``HFCausalLM``: a Hugging Face ``transformers`` causal LM (GPT-2, Llama, ... any
``AutoModelForCausalLM``) built from a config given in the run's config, trained by the PyTorch
adapter (full-state checkpoints, validated import, bit-exact resume, every option and hook).

Nothing is downloaded: the model is built with ``from_config`` (random weights, seeded; never
remote code), the tokenizer is trained on local text (``text``). To fine-tune existing weights,
start a new stage from a Hugging Face directory (``init_from.safetensors``); ``cairn ckpt
export --format safetensors`` writes one back (``exchange_files``: config and tokenizer)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

from cairn.errors import ConfigError
from cairn.trainers.hf.text import EOS, read_corpus, token_windows, train_tokenizer
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer
from cairn.trainers.pytorch.schedules import warmup_cosine

__all__ = ["HFCausalLM", "HFOptions", "hf_model_config"]

RESERVED = ("vocab_size", "bos_token_id", "eos_token_id", "use_cache")
"""Model config fields Cairn sets itself (from the tokenizer; no KV cache while training)."""


class HFOptions(TorchOptions):
    """``HFCausalLM``'s options: the model's ``transformers`` config, the tokenizer, the corpus and AdamW, beside
    every option of the PyTorch adapter."""

    model: dict[str, Any]
    """The model's Hugging Face config: ``model_type`` (``gpt2``, ``llama``, ...) and any fields of
    that type's config (``n_layer``, ``hidden_size``, ...); ``vocab_size``, ``bos_token_id``, ``eos_token_id``
    and ``use_cache`` are Cairn's (setting them is refused)."""
    vocab_size: int = Field(default=512, ge=258, le=1 << 18)
    """Tokens of the byte-level BPE tokenizer (256 bytes, end-of-text, merges)."""
    corpus: list[str] = Field(default_factory=list, max_length=10_000)
    """Text files to train on, in order (empty: the Python standard library's own sources)."""
    corpus_bytes: int = Field(default=120_000, ge=1024, le=1 << 30)
    """Bytes of the corpus read (at most)."""
    context: int = Field(default=64, ge=2, le=1 << 16)
    """Tokens per training window (at most the model's ``max_position_embeddings``)."""
    val_fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    """Share of the windows held out for validation (at least one)."""
    lr: float = Field(default=1e-3, gt=0)
    """AdamW's peak learning rate."""
    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay, on matrices only (not biases, norms or embeddings)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's ``(beta1, beta2)``."""
    warmup: int = Field(default=20, ge=0)
    """Updates of linear warmup; then a cosine decay to ``min_lr_ratio`` x ``lr`` over ``decay_steps``."""
    decay_steps: int = Field(default=1000, ge=1)
    """Updates of the cosine decay after warmup; the rate stays at its floor after them."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """The floor of the decay, as a fraction of ``lr``."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Keep the parameters (and so AdamW's moments) in this dtype."""
    attn_implementation: Literal["eager", "sdpa"] = "eager"
    """Attention kernel, written into the exported ``config.json`` so ``from_pretrained`` gives the same logits."""

    @field_validator("model")
    @classmethod
    def _model_type(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(value.get("model_type"), str):
            raise ValueError(f"model needs a model_type such as 'gpt2' or 'llama' (found {value.get('model_type')!r})")
        reserved = sorted(set(RESERVED) & set(value))
        if reserved:
            raise ValueError(f"model must not set {reserved}: Cairn sets them from the tokenizer")
        return value


def hf_model_config(options: HFOptions, vocab_size: int, eos_id: int) -> PretrainedConfig:
    """The ``transformers`` config of the model ``options`` describe (typed errors, never a download)."""
    fields = {k: v for k, v in options.model.items() if k != "model_type"}
    try:
        config = AutoConfig.for_model(options.model["model_type"], **fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            "trainer.options.model", expected="a transformers config (model_type and its fields)", found=str(exc)[:200]
        ) from None
    config.vocab_size = vocab_size
    config.bos_token_id = config.eos_token_id = eos_id
    config.use_cache = False
    longest = getattr(config, "max_position_embeddings", None)
    if isinstance(longest, int) and longest < options.context:
        raise ConfigError(
            "trainer.options.model.max_position_embeddings", expected=f">= context ({options.context})", found=longest
        )
    return config


class HFCausalLM(TorchTrainer):
    """A ``transformers`` causal LM on a tokenized text corpus; see the module docstring."""

    def split_hint(self, split: str) -> str:
        if split == "val":
            return "set trainer.options.val_fraction"
        return "this trainer holds out a validation split only (--split val)"

    Options = HFOptions
    options: HFOptions

    def build(self) -> TorchSetup:
        o = self.options
        text = read_corpus(o.corpus, o.corpus_bytes)
        self.tokenizer = train_tokenizer(text, o.vocab_size)
        eos = self.tokenizer.token_to_id(EOS)
        assert eos is not None, "train_tokenizer adds EOS"
        self.hf_config = hf_model_config(o, self.tokenizer.get_vocab_size(), eos)
        x, y = token_windows(self.tokenizer, text, o.context)
        n_val = max(1, int(x.shape[0] * o.val_fraction))
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            self.hf_config, attn_implementation=o.attn_implementation, dtype=getattr(torch, o.param_dtype)
        )
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for p in model.parameters():
            (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o.lr,
            betas=o.betas,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(o.warmup, o.decay_steps, o.min_lr_ratio))
        described = self.hf_config.to_dict()
        described.pop("transformers_version", None)  # the architecture, not the library's release
        digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:12]
        return TorchSetup(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train=(x[n_val:], y[n_val:]),
            val=(x[:n_val], y[:n_val]),
            version=f"hf-{self.hf_config.model_type}-{digest}-{o.param_dtype}",
            data_version=f"text-bpe{self.tokenizer.get_vocab_size()}",
        )

    def forward(self, x: Any) -> Any:
        return self.model(input_ids=x).logits

    def exchange_files(self) -> dict[str, bytes]:
        """The files of a Hugging Face directory besides the weights: ``config.json`` (in the
        parameters' dtype) and the tokenizer's files."""
        config = self.hf_config.to_dict()
        config["architectures"] = [type(self.model).__name__]
        config["dtype"] = self.options.param_dtype
        config["use_cache"] = True  # the exported model is for inference
        config["attn_implementation"] = self.options.attn_implementation  # the same logits as trained
        files = {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()}
        fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=self.tokenizer, eos_token=EOS, bos_token=EOS
        )
        with tempfile.TemporaryDirectory() as tmp:
            fast.save_pretrained(tmp)
            for path in sorted(Path(tmp).iterdir()):
                files[path.name] = path.read_bytes()
        return files
