"""``HFCausalLM``: a Hugging Face ``transformers`` causal LM (GPT-2, Llama, ... any
``AutoModelForCausalLM``) built from a config given in the run's config, or read from a local
pretrained directory with its own tokenizer (``pretrained``), optionally with LoRA adapters on
the frozen base (``lora``), trained by the PyTorch adapter (full-state checkpoints, validated
import, bit-exact resume, every option and hook).

Nothing is downloaded: the model is built with ``from_config`` (seeded; never remote code) and
either trained from that initialisation with a tokenizer trained on local text (``text``), or
loaded from the directory's weights through the validated import (``pretrained``). ``cairn ckpt
export --format safetensors`` writes a Hugging Face directory back (``exchange_files``: config
and tokenizer; with LoRA, the adapters merged into the base), ``--format peft`` a LoRA run's
adapter directory (``computed_export``)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_serializer, model_validator
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

from cairn.errors import ConfigError
from cairn.interop import ComputedWeights
from cairn.state import TrainState
from cairn.trainers.hf.lora import LoraOptions, adapter_weights, merged_weights, wrap_lora
from cairn.trainers.hf.pretrained import PretrainedSource, load_pretrained_weights, read_pretrained
from cairn.trainers.hf.text import EOS, read_corpus, token_windows, train_tokenizer
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer
from cairn.trainers.pytorch.records import DataFiles, RecordLoader
from cairn.trainers.pytorch.schedules import warmup_cosine

__all__ = ["HFCausalLM", "HFOptions", "hf_model_config"]

RESERVED = ("vocab_size", "bos_token_id", "eos_token_id", "use_cache")
"""Model config fields Cairn sets itself (from the tokenizer; no KV cache while training)."""


class HFOptions(TorchOptions):
    """``HFCausalLM``'s options: the model (a ``transformers`` config, or a pretrained directory),
    the tokenizer, LoRA, the corpus and AdamW, beside every option of the PyTorch adapter."""

    model: dict[str, Any] | None = None
    """The model's Hugging Face config: ``model_type`` (``gpt2``, ``llama``, ...) and any fields of
    that type's config (``n_layer``, ``hidden_size``, ...); ``vocab_size``, ``bos_token_id``, ``eos_token_id``
    and ``use_cache`` are Cairn's (setting them is refused). Exactly one of ``model`` and ``pretrained``."""
    pretrained: str | None = Field(default=None, min_length=1, max_length=4096)
    """A local Hugging Face directory to fine-tune: its ``config.json``, weights (``model.safetensors``
    or an index and its shards, through the validated import) and tokenizer (``tokenizer.json``,
    never retrained). Its content hash is part of the model version in the lineage."""
    lora: LoraOptions | None = None
    """LoRA adapters on the frozen base (``peft``): only the adapters train and the optimizer holds
    only them; null: every weight trains."""
    data: DataFiles | None = None
    """Local JSONL, Parquet or text files streamed with resumable state, tokenised on the fly and
    packed to ``data.context`` tokens (instead of the ``corpus`` windows; needs ``epoch_steps``:
    a stream has no length). Chat and instruction records train on the replies only."""
    val_data: DataFiles | None = None
    """Validation files, read once in order at each evaluation (with ``data``; none: no validation)."""
    vocab_size: int = Field(default=512, ge=258, le=1 << 18)
    """Tokens of the byte-level BPE tokenizer (256 bytes, end-of-text, merges); not with ``pretrained``."""
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
    def _model_type(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        if not isinstance(value.get("model_type"), str):
            raise ValueError(f"model needs a model_type such as 'gpt2' or 'llama' (found {value.get('model_type')!r})")
        reserved = sorted(set(RESERVED) & set(value))
        if reserved:
            raise ValueError(f"model must not set {reserved}: Cairn sets them from the tokenizer")
        return value

    @model_validator(mode="after")
    def _one_model(self) -> HFOptions:
        if (self.model is None) == (self.pretrained is None):
            raise ValueError(
                "exactly one of model (a config to build) and pretrained (a local Hugging Face directory) "
                f"is needed (found {'both' if self.model else 'neither'})"
            )
        if self.pretrained is not None and "vocab_size" in self.model_fields_set:
            raise ValueError("vocab_size is for the tokenizer Cairn trains: a pretrained model keeps its own")
        if self.val_data is not None and self.data is None:
            raise ValueError("val_data needs data (the corpus holds out val_fraction of its own windows)")
        if self.data is not None and self.epoch_steps is None:
            raise ValueError("data is a stream without a length: set epoch_steps (the updates an epoch means)")
        return self

    @model_serializer(mode="wrap")
    def _cpu_is_implied(self, handler: Any) -> Any:
        """As the adapter's; and the options a run does not use (``model`` or ``pretrained``,
        ``lora``; ``vocab_size`` with ``pretrained``) are left out, so a config dumps and hashes
        as before they existed and a dump validates again."""
        body = TorchOptions._cpu_is_implied(self, handler)
        for name in ("model", "pretrained", "lora", "data", "val_data"):
            if body.get(name) is None:
                body.pop(name, None)
        if "pretrained" in body:
            body.pop("vocab_size", None)  # the pretrained tokenizer's: never set
        return body


def hf_model_config(options: HFOptions, vocab_size: int, eos_id: int) -> PretrainedConfig:
    """The ``transformers`` config of the model ``options`` describe (typed errors, never a download)."""
    assert options.model is not None, "a model built from a config"
    fields = {k: v for k, v in options.model.items() if k != "model_type"}
    try:
        config = AutoConfig.for_model(options.model["model_type"], **fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            "trainer.options.model", expected="a transformers config (model_type and its fields)", found=str(exc)[:200]
        ) from None
    config.vocab_size = vocab_size
    config.bos_token_id = config.eos_token_id = eos_id
    context = options.data.context if options.data else options.context
    return _for_training(config, context, "trainer.options.model.max_position_embeddings")


def _for_training(config: PretrainedConfig, context: int, field: str) -> PretrainedConfig:
    """``config`` without a KV cache (training), once its positions cover ``context``."""
    config.use_cache = False
    longest = getattr(config, "max_position_embeddings", None)
    if isinstance(longest, int) and longest < context:
        raise ConfigError(field, expected=f">= context ({context})", found=longest)
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
        dtype = getattr(torch, o.param_dtype)
        self.source: PretrainedSource | None = None
        if o.pretrained is None:
            text = read_corpus(o.corpus, o.corpus_bytes)
            self.tokenizer = train_tokenizer(text, o.vocab_size)
            eos = self.tokenizer.token_to_id(EOS)
            assert eos is not None, "train_tokenizer adds EOS"
            self.hf_config = hf_model_config(o, self.tokenizer.get_vocab_size(), eos)
            model = self._from_config(dtype)
            origin, data_version = "", f"text-bpe{self.tokenizer.get_vocab_size()}"
        else:
            self.source = source = read_pretrained(o.pretrained)
            self.tokenizer = source.backend
            text = "" if o.data else read_corpus(o.corpus, o.corpus_bytes, separator=source.separator)
            field = "trainer.options.pretrained: max_position_embeddings"
            self.hf_config = _for_training(source.config, o.data.context if o.data else o.context, field)
            model = self._from_config(source.dtype)  # the directory's dtype: its weights are read as stored
            origin = f"-pretrained-{load_pretrained_weights(source, model)}"
            model.to(dtype)
            data_version = f"text-pretrained-{len(source.tokenizer)}"
        self.base_class = type(model).__name__
        if o.lora is not None:
            model = wrap_lora(model, o.lora)
            origin += f"-lora-r{o.lora.r}"
        train, val = self._data(text)
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for p in model.parameters():
            if p.requires_grad:  # with LoRA: the adapters only
                (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=o.lr, betas=o.betas)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(o.warmup, o.decay_steps, o.min_lr_ratio))
        described = self.hf_config.to_dict()
        described.pop("transformers_version", None)  # the architecture, not the library's release
        if o.pretrained is not None:  # not where the directory is (a config built here has "": kept, as before)
            described.pop("_name_or_path", None)
        digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return TorchSetup(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train=train,
            val=val,
            version=f"hf-{self.hf_config.model_type}-{digest}-{o.param_dtype}{origin}",
            data_version=data_version if o.data is None else f"{data_version}-files-{o.data.records}",
        )

    def _data(self, text: str) -> tuple[Any, Any]:
        """The train and validation splits: the corpus's windows, or the streamed files."""
        o = self.options
        if o.data is None:
            x, y = token_windows(self.tokenizer, text, o.context)
            n_val = max(1, int(x.shape[0] * o.val_fraction))
            return (x[n_val:], y[n_val:]), (x[:n_val], y[:n_val])
        tokenizer = self.tokenizer if self.source is None else self.source.tokenizer
        seed = self.config.seed
        train = RecordLoader(o.data, tokenizer, self.config.batch_size, seed, field="trainer.options.data")
        if o.val_data is None:
            return train, None
        val = RecordLoader(
            o.val_data, tokenizer, o.eval_batch_size, seed, train=False, field="trainer.options.val_data"
        )
        return train, val

    def _from_config(self, dtype: torch.dtype) -> torch.nn.Module:
        model: torch.nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            self.hf_config, attn_implementation=self.options.attn_implementation, dtype=dtype
        )
        return model

    def forward(self, x: Any) -> Any:
        return self.model(input_ids=x).logits

    def exchange_files(self) -> dict[str, bytes]:
        """The files of a Hugging Face directory besides the weights: ``config.json`` (in the
        parameters' dtype) and the tokenizer's files (a pretrained directory's own, as read)."""
        config = self.hf_config.to_dict()
        config.pop("_name_or_path", None)
        config["architectures"] = [self.base_class]
        config["dtype"] = self.options.param_dtype
        config["use_cache"] = True  # the exported model is for inference
        config["attn_implementation"] = self.options.attn_implementation  # the same logits as trained
        files = {"config.json": (json.dumps(config, indent=2, sort_keys=True, default=str) + "\n").encode()}
        return {**files, **self.tokenizer_files()}

    def tokenizer_files(self) -> dict[str, bytes]:
        if self.source is not None:
            return dict(self.source.files)
        fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=self.tokenizer, eos_token=EOS, bos_token=EOS
        )
        files = {}
        with tempfile.TemporaryDirectory() as tmp:
            fast.save_pretrained(tmp)
            for path in sorted(Path(tmp).iterdir()):
                files[path.name] = path.read_bytes()
        return files

    # -- exports computed from a state (cairn.interop.exchange.ComputedExport) -------------------
    def computed_formats(self) -> frozenset[str]:
        """With LoRA: ``safetensors`` (the adapters merged into the base) and ``peft`` (the adapters)."""
        return frozenset({"safetensors", "peft"}) if self.options.lora is not None else frozenset()

    def computed_export(self, fmt: str, state: TrainState) -> ComputedWeights:
        if fmt not in self.computed_formats():
            raise ConfigError("--format", expected=sorted(self.computed_formats()), found=fmt)
        self.load_state(state)
        self.model.eval()
        if fmt == "peft":
            where = self.options.pretrained
            base = None if where is None else str(Path(where).expanduser().resolve())
            return adapter_weights(self.model, base, self.tokenizer_files())  # type: ignore[arg-type]
        return merged_weights(self.model, self.exchange_files())  # type: ignore[arg-type]
