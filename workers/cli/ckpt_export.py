"""``cairn ckpt export``: a checkpoint's weights as safetensors, streamed and verified
(``cairn.interop.export``): a Hugging Face directory for a model that has one, else a
weights-only file; for a LoRA run, the adapters merged into the base (``--format safetensors``)
or the adapters alone as a PEFT directory (``--format peft``), computed from the checkpoint's
state read with every check; or its model and optimizer state as a PyTorch Distributed
Checkpoint (``--format dcp``), from that state too."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from cairn.checkpoint import CheckpointKind, CheckpointOptions, CheckpointRef, manifest_config, read_manifest
from cairn.config import load_config
from cairn.errors import ConfigError
from cairn.interop import (
    DEFAULT_MAX_FILE_BYTES,
    ComputedExport,
    ExportResult,
    export_arrays,
    export_checkpoint,
    export_dcp,
)
from cairn.stores import open_store
from cairn.trainers import check_training_manifest, trainer_for_checkpoint
from cairn.training import load_training_with_trainer
from workers.cli.output import emit

__all__ = ["add_export_parser", "cmd_ckpt_export", "file_size"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def file_size(text: str) -> int:
    """``5GB``, ``500MiB`` or a number of bytes (at least 1 KiB)."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or int(match.group(1)) * _UNITS[unit] < 1024:
        raise argparse.ArgumentTypeError(f"expected a size such as 5GB or 500MiB (>= 1KiB), found {text!r}")
    return int(match.group(1)) * _UNITS[unit]


def add_export_parser(ckpt_sub: Any, common: Any) -> None:
    p = ckpt_sub.add_parser(
        "export",
        help="write a checkpoint's weights as safetensors: a Hugging Face directory (config, weights, tokenizer) "
        "for a Hugging Face model (a LoRA run's adapters merged in), a weights-only file for any other; "
        "--format peft: a LoRA run's adapters as a PEFT adapter directory; --format dcp: the model and "
        "optimizer state as a PyTorch Distributed Checkpoint",
    )
    common(p)
    p.add_argument("checkpoint")
    p.add_argument("directory", help="a new or empty directory")
    p.add_argument(
        "--format",
        choices=["safetensors", "peft", "dcp"],
        required=True,
        help="safetensors: the model's weights; peft: a LoRA run's adapters (adapter_config.json, "
        "adapter_model.safetensors); dcp: {'model': state dict, 'optimizer': FQN-keyed optimizer state dict} "
        "as torch.distributed.checkpoint.save writes it (.metadata, .distcp)",
    )
    p.add_argument(
        "--weights-only",
        action="store_true",
        help="only the weights file, even for a Hugging Face model; with dcp: the model, no optimizer",
    )
    p.add_argument(
        "--max-file-size",
        type=file_size,
        default=DEFAULT_MAX_FILE_BYTES,
        help="shard the safetensors weights into files of at most this size, with an index (default 5GB)",
    )
    p.add_argument("--config", help="the run's config: builds the trainer; the checkpoint must match it")
    p.set_defaults(handler=cmd_ckpt_export)


def cmd_ckpt_export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    ref = CheckpointRef.parse(args.checkpoint)
    if ref.kind != CheckpointKind.TRAINING:
        raise ConfigError("checkpoint", expected="a training checkpoint", found=f"a {ref.kind.value} checkpoint")
    store = open_store(ref.store_url)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    given = load_config(args.config) if args.config else None
    # From --config when given (the checkpoint must match it), else the checkpoint's own if trusted;
    # on the host: a GPU run's too, GPU or not.
    trainer = trainer_for_checkpoint(manifest_config(manifest), given, on_host=True)
    check_training_manifest(manifest, trainer=trainer)  # the tensors are this model's
    computed = trainer.computed_formats() if isinstance(trainer, ComputedExport) else frozenset()
    if args.format == "peft" and args.weights_only:
        raise ConfigError("--weights-only", expected="--format safetensors (an adapter directory is one)", found="peft")
    if args.format == "peft" and "peft" not in computed:
        raise ConfigError(
            "--format peft", expected="a run with LoRA adapters (trainer.options.lora)", found="a run without"
        )
    if args.format == "dcp":
        state, _, _ = load_training_with_trainer(store, ref, trainer=trainer, options=CheckpointOptions.from_env())
        result = export_dcp(state, trainer, Path(args.directory), weights_only=args.weights_only)
        return _report(args, ref, manifest.fingerprint, result)
    if args.format in computed and not args.weights_only:
        assert isinstance(trainer, ComputedExport)
        state, _, _ = load_training_with_trainer(store, ref, trainer=trainer, options=CheckpointOptions.from_env())
        metadata = {
            "format": "pt",
            "cairn_checkpoint": str(ref),
            "cairn_fingerprint": manifest.fingerprint,
            "cairn_step": str(manifest.step),
        }
        result = export_arrays(
            trainer.computed_export(args.format, state),
            Path(args.directory),
            metadata,
            max_file_bytes=args.max_file_size,
        )
        return _report(args, ref, manifest.fingerprint, result)
    with tqdm(desc=f"export {ref.run_id}@{ref.step}", unit="B", unit_scale=True, disable=None, leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = export_checkpoint(
            store,
            ref,
            manifest,
            trainer,
            Path(args.directory),
            weights_only=args.weights_only,
            max_file_bytes=args.max_file_size,
            progress=progress,
        )
    return _report(args, ref, manifest.fingerprint, result)


WHAT = {
    "huggingface": "a Hugging Face directory (AutoModelForCausalLM.from_pretrained loads it)",
    "peft": "a PEFT adapter directory (peft.PeftModel.from_pretrained(base, DIR) loads it)",
    "weights-only": "WEIGHTS ONLY (parameters and buffers; not a checkpoint: no optimizer, step, RNG or data cursor)",
    "dcp": "a PyTorch Distributed Checkpoint of the model and optimizer state dicts (torch.distributed.checkpoint"
    ".load reads it into get_state_dict(model, optimizer); not the run's step, RNG or data cursor)",
    "dcp-weights-only": "a PyTorch Distributed Checkpoint of the model's state dict: WEIGHTS ONLY (no optimizer, "
    "step, RNG or data cursor)",
}


def _report(args: argparse.Namespace, ref: CheckpointRef, fingerprint: str, result: ExportResult) -> int:
    what = WHAT[result.kind]
    emit(
        args,
        {
            "checkpoint": str(ref),
            "directory": str(result.directory),
            "kind": result.kind,
            "files": result.files,
            "tensors": result.tensors,
            "bytes": result.bytes,
            "fingerprint": fingerprint,
        },
        f"exported {ref} to {result.directory}: {what}; {result.tensors} tensors, {result.bytes} bytes in "
        f"{', '.join(result.files)}; every block's checksum verified",
    )
    return 0
