"""A Weights & Biases run per Cairn run, fed exactly once per committed step.

Every write resumes the same W&B run id (derived from the run id) and logs each step's values in
one ``log`` call at that step. The step guard: no step at or below what the run already holds is
logged. Offline (``mode: offline``) what it holds is read back from the run's own files
(``DIR/wandb/offline-run-*/run-ID.wandb``, every write's directory; a record cut short ends the
read), and ``wandb sync`` later merges them into one run; online it is the resumed run's step.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError, EffectUnavailableError
from cairn.trackers.export import PointBatch
from cairn.trackers.libraries import import_extra

__all__ = ["WandbSink", "wandb_run_id", "offline_steps"]

NEEDED_BY = "the Weights & Biases tracker"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The offline run file: a LevelDB-style log (":W&B" header, 32 KiB blocks, records cut in pieces).
_IDENT, _HEADER, _BLOCK = b":W&B", 7, 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_CRC = [zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in range(5)]


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of a Cairn run: the run id itself when W&B takes it, else a digest."""
    if _ID.match(run_id):
        return run_id
    return "cairn-" + hashlib.sha256(run_id.encode()).hexdigest()[:24]


def _records(raw: bytes) -> Iterator[bytes]:
    if raw[: len(_IDENT)] != _IDENT:
        return
    pos, parts = _HEADER, b""
    while True:
        if _BLOCK - pos % _BLOCK < _HEADER:
            pos += _BLOCK - pos % _BLOCK  # a block's tail too short for a header is padding
        if pos + _HEADER > len(raw):
            return
        checksum, length, kind = struct.unpack_from("<IHB", raw, pos)
        data = raw[pos + _HEADER : pos + _HEADER + length]
        if kind > _LAST or len(data) < length or zlib.crc32(data, _CRC[kind]) & 0xFFFFFFFF != checksum:
            return  # cut short (the writer was killed): nothing past it is trusted
        pos += _HEADER + length
        if kind == _FULL:
            yield data
        elif kind == _FIRST:
            parts = data
        elif kind == _MIDDLE:
            parts += data
        else:
            yield parts + data


def offline_steps(directory: Path, run: str) -> dict[str, int]:
    """Per metric, the last step the offline files of W&B run ``run`` under ``directory`` hold."""
    pb = import_extra("wandb.proto.wandb_internal_pb2", "wandb", NEEDED_BY)
    last: dict[str, int] = {}
    for path in sorted((directory / "wandb").glob(f"offline-run-*/run-{run}.wandb")):
        for data in _records(path.read_bytes()):
            record = pb.Record.FromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            step = int(record.history.step.num)
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                if not name.startswith("_"):
                    last[name] = max(last.get(name, 0), step)
    return last


class WandbSink:
    kind = "wandb"

    def __init__(self, project: str, directory: str, mode: str = "offline", entity: str | None = None) -> None:
        if mode not in ("offline", "online"):
            raise ConfigError("wandb.mode", expected="offline or online", found=mode)
        path = Path(directory)
        if not path.is_absolute():
            raise ConfigError("wandb.dir", expected="an absolute directory", found=directory)
        self.project, self.directory, self.mode, self.entity = project, path, mode, entity
        self._wandb = import_extra("wandb", "wandb", NEEDED_BY)

    def destination(self) -> dict[str, str]:
        return {"project": self.project, "dir": str(self.directory), "mode": self.mode, "entity": self.entity or ""}

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except (OSError, self._wandb.Error) as exc:
            raise EffectUnavailableError(f"W&B: {exc}", field=self.project) from exc

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        if self.mode == "offline":
            with self._mapped():
                return offline_steps(self.directory, wandb_run_id(run_id))
        return {}  # online: the resumed run's step guards every write

    def _init(self, run_id: str) -> Any:
        settings = self._wandb.Settings(
            console="off", save_code=False, disable_git=True, x_disable_stats=True, x_disable_meta=True
        )
        return self._wandb.init(
            project=self.project,
            entity=self.entity,
            id=wandb_run_id(run_id),
            name=run_id,
            dir=str(self.directory),
            mode=self.mode,
            resume="allow",
            settings=settings,
        )

    def write(self, batch: PointBatch) -> None:
        if not batch.points:
            return
        with self._mapped():
            self.directory.mkdir(parents=True, exist_ok=True)
            run = self._init(batch.run_id)
            try:
                guard = int(run.step) - 1 if self.mode == "online" else 0  # steps the resumed run holds
                for point in batch.points:
                    if point.step > guard:
                        run.log(dict(point.values), step=point.step)
            finally:
                run.finish()
