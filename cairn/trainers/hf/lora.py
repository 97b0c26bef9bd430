"""LoRA adapters on a frozen base (``peft``): the options, the wrapped model (base weights
``requires_grad=False``, so the optimizer holds the adapters only), and the two exports of a
state: the adapters alone as a PEFT adapter directory, and the adapters merged into the base as a
full Hugging Face directory."""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from pydantic import BaseModel, ConfigDict, Field

from cairn.errors import ConfigError
from cairn.interop import ComputedWeights
from cairn.trainers.pytorch.state_io import state_dict_names, to_numpy

__all__ = ["ADAPTER", "LoraOptions", "adapter_weights", "merged_weights", "wrap_lora"]

ADAPTER = "default"
"""The one adapter's name inside the PEFT model (PEFT's own default)."""


class LoraOptions(BaseModel):
    """``trainer.options.lora``: LoRA adapters on a frozen base (``peft.LoraConfig``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    r: int = Field(default=8, ge=1, le=4096)
    """The adapters' rank."""
    alpha: float = Field(default=16, gt=0)
    """LoRA's alpha: the update is scaled by ``alpha / r``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input (drawn from the run's RNG streams: checkpointed)."""
    target_modules: list[str] | None = Field(default=None, min_length=1, max_length=256)
    """Names (suffixes) of the modules that get adapters, e.g. ``["q_proj", "v_proj"]``; null:
    PEFT's default for the architecture."""


def wrap_lora(model: torch.nn.Module, options: LoraOptions) -> PeftModel:
    """``model`` with LoRA adapters: every base weight frozen, the adapters trainable."""
    config = LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,  # type: ignore[arg-type]
        lora_dropout=options.dropout,
        target_modules=options.target_modules,
    )
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)  # peft calls a deprecated transformers API
            wrapped = get_peft_model(model, config, adapter_name=ADAPTER)
    except (ValueError, KeyError, TypeError) as exc:
        text = str(exc).strip().splitlines()
        raise ConfigError(
            "trainer.options.lora", expected="a LoRA config this model accepts", found=(text or [""])[0][:200]
        ) from None
    return wrapped


def adapter_weights(model: PeftModel, base: str | None, files: dict[str, bytes]) -> ComputedWeights:
    """The adapters as PEFT saves them (``adapter_model.safetensors`` keys, ``adapter_config.json``
    naming ``base``), with ``files`` (the tokenizer's) beside them."""
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    arrays = {key: to_numpy(t.detach().cpu().contiguous()) for key, t in state.items()}
    config = copy.copy(model.peft_config[ADAPTER])
    config.base_model_name_or_path = base
    config.inference_mode = True
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        written = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}
    return ComputedWeights(arrays, {**written, **files}, stem="adapter_model", kind="peft")


def merged_weights(model: PeftModel, files: dict[str, bytes]) -> ComputedWeights:
    """The base with the adapters merged in (``merge_and_unload`` of a copy), under the base
    model's ``state_dict`` keys (tied aliases left out, as ``save_pretrained`` does)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        merged: Any = copy.deepcopy(model).merge_and_unload()
    names, _aliases = state_dict_names(merged, dict(merged.named_parameters()), dict(merged.named_buffers()))
    state = merged.state_dict()
    arrays = {key: to_numpy(state[key].detach().cpu().contiguous()) for key in names}
    return ComputedWeights(arrays, files, stem="model", kind="huggingface")
