"""Datasets larger than memory: local JSONL, Parquet and text files read as a stream whose
position rides in the checkpoint's data cursor (a resume continues with the same sequences, bit
for bit, across epochs and shuffling, with or without loader workers), tokenised on the fly,
packed to ``context`` tokens, chat and instruction records trained on their replies only, and
identified by the files' content hashes at O(files) cost (docs/how-to/data.md).

Modules: ``options`` (``DataFiles``: the config section), ``readers`` (records from a position,
bounded, malformed input refused), ``fingerprint`` (cached content hashes; changed files
refused), ``documents`` (a record as token ids and loss mask), ``lanes`` (packing and shuffling
with a small position), ``stream`` (the dataset and its loader)."""

from cairn.trainers.pytorch.records.options import DataFile, DataFiles
from cairn.trainers.pytorch.records.stream import RecordLoader, RecordStream

__all__ = ["DataFile", "DataFiles", "RecordLoader", "RecordStream"]
