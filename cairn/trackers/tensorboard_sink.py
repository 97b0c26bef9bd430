"""TensorBoard event files, written exactly once per committed step.

``LOG_DIR/RUN/events.out.tfevents.BLOCK.cairn``: block ``k`` holds the run's steps
``(k*BLOCK_STEPS, (k+1)*BLOCK_STEPS]``, so its name is a function of the steps alone. A write
replaces a block whole (a temporary file, then an atomic rename): the new file is the old one's
bytes and the new events after them, so a reader never sees a half-written file, a retry
rewrites the same file with the same steps, and TensorBoard, which reads block files in name
order, sees each step once. What the sink holds is read back from the files themselves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError, EffectError, EffectUnavailableError
from cairn.trackers.export import PointBatch
from cairn.trackers.libraries import import_extra
from cairn.trackers.points import StepPoints

__all__ = ["TensorBoardSink", "BLOCK_STEPS", "block_name"]

BLOCK_STEPS = 10_000
"""Steps per event file: a write rewrites at most one partly filled block."""
FILE_VERSION = "brain.Event:2"
TMP_MARK = ".cairn-tmp-"
"""Temporary files (no ``tfevents`` in the name, so TensorBoard never reads one)."""


def block_name(block: int) -> str:
    return f"events.out.tfevents.{block:010d}.cairn"


def _block_of(step: int) -> int:
    return (step - 1) // BLOCK_STEPS


class TensorBoardSink:
    """Scalars of a run under ``log_dir/RUN`` (one TensorBoard run per Cairn run)."""

    kind = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        path = Path(log_dir)
        if not path.is_absolute():
            raise ConfigError("tensorboard.log_dir", expected="an absolute directory", found=str(log_dir))
        self.log_dir = path
        self._pb = import_extra("tensorboard.compat.proto.event_pb2", "tensorboard", "the TensorBoard tracker")
        self._summary = import_extra("tensorboard.compat.proto.summary_pb2", "tensorboard", "the TensorBoard tracker")
        self._crc = import_extra(
            "tensorboard.compat.tensorflow_stub.pywrap_tensorflow", "tensorboard", "the TensorBoard tracker"
        ).masked_crc32c

    def destination(self) -> dict[str, str]:
        return {"log_dir": str(self.log_dir)}

    def run_dir(self, run_id: str) -> Path:
        return self.log_dir / run_id

    # -- reading back ----------------------------------------------------------------------------
    def _records(self, raw: bytes) -> Iterator[bytes]:
        pos = 0
        while pos + 12 <= len(raw):
            (length,) = struct.unpack_from("<Q", raw, pos)
            end = pos + 12 + length + 4
            if end > len(raw) or struct.unpack_from("<I", raw, end - 4)[0] != self._crc(raw[pos + 12 : end - 4]):
                return  # not a record this sink wrote whole: nothing past it is trusted
            yield raw[pos + 12 : end - 4]
            pos = end

    def steps_in(self, path: Path) -> list[int]:
        """The step of every scalar event in one of this sink's files."""
        steps = []
        for record in self._records(path.read_bytes()):
            event = self._pb.Event.FromString(record)
            if event.HasField("summary"):
                steps.append(int(event.step))
        return steps

    def _blocks(self, run_id: str) -> list[Path]:
        directory = self.run_dir(run_id)
        if not directory.is_dir():
            return []
        return sorted(
            p for p in directory.iterdir() if p.name.startswith("events.out.tfevents.") and p.suffix == ".cairn"
        )

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        with _unavailable(self.log_dir):
            blocks = self._blocks(run_id)
            last = max(self.steps_in(blocks[-1]), default=0) if blocks else 0
        return dict.fromkeys(names, last)

    # -- writing ---------------------------------------------------------------------------------
    def _event(self, **fields: Any) -> bytes:
        data: bytes = self._pb.Event(**fields).SerializeToString()
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", self._crc(header)) + data + struct.pack("<I", self._crc(data))

    def _scalars(self, point: StepPoints, wall_time: float) -> bytes:
        values = [self._summary.Summary.Value(tag=k, simple_value=v) for k, v in point.values.items()]
        return self._event(wall_time=wall_time, step=point.step, summary=self._summary.Summary(value=values))

    def write(self, batch: PointBatch) -> None:
        by_block: dict[int, list[StepPoints]] = {}
        for point in batch.points:
            by_block.setdefault(_block_of(point.step), []).append(point)
        directory = self.run_dir(batch.run_id)
        with _unavailable(self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
            for stale in directory.glob(f"{TMP_MARK}*"):  # a write killed before its rename
                stale.unlink(missing_ok=True)
            for block, points in sorted(by_block.items()):
                path = directory / block_name(block)
                old = (
                    path.read_bytes()
                    if path.exists()
                    else self._event(wall_time=batch.wall_time, file_version=FILE_VERSION)
                )
                new = b"".join(self._scalars(p, batch.wall_time) for p in points)
                _replace(path, old + new)


def _replace(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole, or keeps what it held: written beside it, synced, renamed."""
    tmp = path.with_name(f"{TMP_MARK}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the rename itself durable where the platform allows
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _unavailable(log_dir: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno in _PERMANENT:  # a retry meets the same answer: the run fails, it does not hang
            raise EffectError(f"TensorBoard log dir: {exc}", field=str(log_dir)) from exc
        raise EffectUnavailableError(f"TensorBoard log dir: {exc}", field=str(log_dir)) from exc


_PERMANENT = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})
"""Errors of the log dir itself (no permission, read-only, a file where a directory should be)."""
