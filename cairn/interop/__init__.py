"""Weights in and out of the ecosystem: safetensors files and Hugging Face directories.

``safetensors``: the file format (header, dtypes) read under limits, never trusting a size it
declares; ``export``: a checkpoint streamed into a directory, block by block, every checksum
verified on the way; ``weights``: a directory or file read as a new stage's initial weights,
validated against the model before anything replaces a state."""

from cairn.interop.export import ExportResult, export_checkpoint
from cairn.interop.weights import read_weights

__all__ = ["ExportResult", "export_checkpoint", "read_weights"]
