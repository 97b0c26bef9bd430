"""Weights in and out of the ecosystem: safetensors files and Hugging Face directories.

Modules: ``safetensors`` (the file format: header, dtypes, read under limits, never trusting a
size it declares), ``export`` (a checkpoint streamed into a directory, block by block, every
checksum verified on the way), ``weights`` (a directory or file read as a new stage's initial
weights, validated against the model before anything replaces a state), ``exchange`` (what they
need of a model: a protocol, so that interop sits below the trainers)."""

from cairn.interop.exchange import ComputedExport, ComputedWeights
from cairn.interop.export import DEFAULT_MAX_FILE_BYTES, ExportResult, export_arrays, export_checkpoint
from cairn.interop.weights import read_weights

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "ComputedExport",
    "ComputedWeights",
    "ExportResult",
    "export_arrays",
    "export_checkpoint",
    "read_weights",
]
