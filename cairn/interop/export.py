"""A checkpoint's weights as safetensors: a Hugging Face directory (``config.json``, the weights,
the tokenizer's files) when the trainer provides the files around the weights
(``Trainer.exchange_files``), else (or with ``weights_only``) a weights-only file of the
parameters under the names ``Trainer.exchange_names`` gives.

The export streams: each tensor is read block by block through one reusable buffer and written
at once, so memory stays at that buffer whatever the checkpoint's size, and every block's
checksum is verified on the way. Weights computed from a state (``export_arrays``: LoRA
adapters merged into their base, or the adapters alone) go through the same writer. The files
are written into a hidden sibling directory that is renamed into place only when every byte is
written and verified; a failure (a corrupt block, a full disk) removes it and leaves nothing at
the destination."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cairn.checkpoint.blocks import logical_specs
from cairn.checkpoint.manifest import Manifest
from cairn.checkpoint.reader import check_shards_present, stream_logical
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import byte_view, dtype_tag
from cairn.errors import ConfigError, TensorSpecError
from cairn.interop.exchange import ComputedWeights, WeightExchange
from cairn.interop.safetensors import INDEX_SUFFIX, FilePlan, header_bytes, plan_files
from cairn.stores.base import Store

__all__ = ["DEFAULT_MAX_FILE_BYTES", "ExportResult", "export_arrays", "export_checkpoint"]

DEFAULT_MAX_FILE_BYTES = 5_000_000_000
"""Data bytes per safetensors file before the export is sharded (``save_pretrained``'s 5 GB)."""
Progress = Callable[[int, int], None]
"""``progress(bytes_written, total_bytes)``, called after every chunk."""


@dataclass
class ExportResult:
    directory: Path
    kind: str
    """``huggingface`` (a directory ``from_pretrained`` loads), ``peft`` (an adapter directory
    ``PeftModel.from_pretrained`` loads) or ``weights-only``."""
    files: list[str] = field(default_factory=list)
    tensors: int = 0
    bytes: int = 0


def _destination(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError("DIR", expected="a new or empty directory", found=f"{out_dir} (exists, not empty)")


def export_checkpoint(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    trainer: WeightExchange,
    out_dir: Path,
    *,
    weights_only: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    chunk_bytes: int = 8 << 20,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the weights of the training checkpoint ``manifest`` (read and checked by
    ``read_manifest``) into ``out_dir``; see the module docstring."""
    _destination(out_dir)
    names, _aliases = trainer.exchange_names()
    specs = logical_specs(manifest)
    missing = sorted(name for name in names.values() if name not in specs)
    if missing:
        raise TensorSpecError(
            "checkpoint lacks weights the model has", field="tensors", expected=missing[:5], found="absent"
        )
    extra = None if weights_only else trainer.exchange_files()
    result = ExportResult(out_dir, "weights-only" if extra is None else "huggingface")
    plans = plan_files(
        {key: specs[name] for key, name in names.items()}, stem=_stem(extra), max_file_bytes=max_file_bytes
    )
    metadata = {
        "format": "pt",
        "cairn_checkpoint": str(ref),
        "cairn_fingerprint": manifest.fingerprint,
        "cairn_step": str(manifest.step),
        "cairn_content": result.kind,
    }
    total = sum(plan.data_bytes for plan in plans)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        check_shards_present(store, ref, manifest)
        buffer = np.empty(max(8, chunk_bytes), dtype=np.uint8)
        for plan in plans:
            with open(tmp / plan.name, "wb") as f:
                f.write(header_bytes(plan, metadata))
                for key in plan.tensors:
                    for chunk in stream_logical(store, ref, manifest, names[key], buffer):
                        f.write(chunk)
                        result.bytes += len(chunk)
                        if progress is not None:
                            progress(result.bytes, total)
            result.files.append(plan.name)
            result.tensors += len(plan.tensors)
        _index_and_files(tmp, plans, _stem(extra), total, metadata, extra or {}, result)
        _publish(tmp, out_dir, result.files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def export_arrays(
    computed: ComputedWeights,
    out_dir: Path,
    metadata: Mapping[str, str],
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> ExportResult:
    """Write weights computed from a checkpoint's state (``ComputedExport``: LoRA adapters
    merged into their base, or the adapters alone) and the files around them into ``out_dir``,
    through the same writer and the same hidden-sibling rename as ``export_checkpoint``."""
    _destination(out_dir)
    specs = {key: (dtype_tag(arr.dtype), tuple(arr.shape)) for key, arr in computed.arrays.items()}
    plans = plan_files(specs, stem=computed.stem, max_file_bytes=max_file_bytes)
    result = ExportResult(out_dir, computed.kind)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        for plan in plans:
            with open(tmp / plan.name, "wb") as f:
                f.write(header_bytes(plan, {**metadata, "cairn_content": computed.kind}))
                for key in plan.tensors:
                    view = byte_view(np.ascontiguousarray(computed.arrays[key]))
                    f.write(view)
                    result.bytes += len(view)
            result.files.append(plan.name)
            result.tensors += len(plan.tensors)
        _index_and_files(tmp, plans, computed.stem, result.bytes, metadata, computed.files, result)
        _publish(tmp, out_dir, result.files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _index_and_files(
    tmp: Path,
    plans: list[FilePlan],
    stem: str,
    total: int,
    metadata: Mapping[str, str],
    files: Mapping[str, bytes],
    result: ExportResult,
) -> None:
    """Beside the weight files in ``tmp``: the index of a sharded export, and the other files."""
    if len(plans) > 1:
        index = {
            "metadata": {"total_size": total, **metadata},
            "weight_map": {key: plan.name for plan in plans for key in plan.tensors},
        }
        name = f"{stem}{INDEX_SUFFIX}"
        (tmp / name).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        result.files.append(name)
    for name, body in files.items():
        (tmp / name).write_bytes(body)
        result.files.append(name)


def _publish(tmp: Path, out_dir: Path, files: list[str]) -> None:
    """Every file durable, then the hidden directory renamed to ``out_dir``."""
    for name in files:
        _fsync(tmp / name)
    _fsync(tmp)
    _destination(out_dir)  # nothing appeared there meanwhile
    if out_dir.exists():
        out_dir.rmdir()
    os.rename(tmp, out_dir)
    _fsync(out_dir.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stem(extra: dict[str, bytes] | None) -> str:
    return "weights-only" if extra is None else "model"
