"""Weights in and out of the ecosystem: safetensors files, Hugging Face directories and PyTorch
Distributed Checkpoints (DCP).

Modules: ``safetensors`` (the file format: header, dtypes, read under limits, never trusting a
size it declares), ``export`` (a checkpoint streamed into a directory, block by block, every
checksum verified on the way), ``weights`` (a directory or file read as a new stage's initial
weights, validated against the model before anything replaces a state), ``exchange`` (what they
need of a model: a protocol, so that interop sits below the trainers), ``pickle_data`` (a pickle
read as data, never run: the classes it names checked against an allowlist, none imported),
``dcp_metadata`` (a DCP's ``.metadata`` read that way), ``dcp`` (a DCP's tensors read under
limits, and a new stage's initial weights from one), ``dcp_export`` (a checkpoint's model and
optimizer state written as a DCP that ``torch.distributed.checkpoint.load`` reads)."""

from cairn.interop.dcp import read_dcp_weights
from cairn.interop.dcp_export import export_dcp
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
    "export_dcp",
    "read_dcp_weights",
    "read_weights",
]
