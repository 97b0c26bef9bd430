"""What every ``cairn`` command prints: its result as text or as one JSON object (``--json``,
always valid JSON), its error as one line on stderr (and as JSON with ``--json``), and where a
report's files go.

While a ``--json`` command runs (``json_stdout``), stdout carries only the JSON documents this
module serialised (``to_json``) and the command printed; everything else written to stdout — the
user's ``print``, a C extension's writes to file descriptor 1, C stdio's buffer — goes to stderr."""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import math
import os
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from cairn.errors import CairnError, ConfigError
from workers.reports.plots import require_plots

__all__ = [
    "CommandFailed",
    "emit",
    "json_stdout",
    "report_dir",
    "report_error",
    "report_usage_error",
    "to_json",
]


class CommandFailed(Exception):
    """A command's verdict is negative (e.g. compare found differences); already reported."""

    def __init__(self, code: int) -> None:
        self.code = code


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such floats become strings, so output stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def to_json(payload: dict[str, Any]) -> str:
    """A command's JSON document; while ``json_stdout`` runs, printing it is what reaches stdout."""
    text = json.dumps(_finite(payload), sort_keys=True, default=str, allow_nan=False)
    channel = _channel
    if channel is not None:
        channel.expect(text)
    return text


class _DocumentStdout(io.TextIOBase):
    """``sys.stdout`` while a ``--json`` command runs: a document ``to_json`` made is kept for the
    real stdout (with the newline ``print`` ends it with); any other text goes to ``stderr``."""

    def __init__(self, stderr: TextIO) -> None:
        super().__init__()
        self.stderr = stderr
        self.documents: list[str] = []
        self._made: set[str] = set()
        self._newline_owed = False  # a document was written without its newline: ``print``'s end follows
        self._lock = threading.Lock()

    def expect(self, document: str) -> None:
        with self._lock:
            self._made.add(document)

    def write(self, text: str) -> int:
        with self._lock:
            owed, self._newline_owed = self._newline_owed, False
            if owed and text == "\n":
                return len(text)
            body = text.removesuffix("\n")
            if body in self._made:
                self.documents.append(body)
                self._newline_owed = body == text
                return len(text)
        return self.stderr.write(text)

    def flush(self) -> None:
        self.stderr.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stderr.isatty()

    def fileno(self) -> int:
        return self.stderr.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stderr.encoding

    @property
    def buffer(self) -> Any:
        """Bytes written to stdout's buffer go where its text goes: to stderr."""
        return self.stderr.buffer


_channel: _DocumentStdout | None = None
"""The stdout of the ``--json`` command running in this process, if one is."""


def _flush_c_stdio() -> None:
    """Write out what C code buffered in its ``stdout`` (a pipe is block-buffered until exit)."""
    with suppress(OSError, AttributeError):  # no C library to reach (not a POSIX process): nothing buffered there
        ctypes.CDLL(None).fflush(None)


@contextmanager
def json_stdout(active: bool) -> Iterator[None]:
    """Run a command whose result is one JSON document (``--json``; else change nothing): its
    document goes to stdout when the command is done, and everything else written to stdout
    meanwhile goes to stderr — Python's ``print`` (``sys.stdout`` is replaced) and writes to file
    descriptor 1 from C code and child processes (descriptor 1 is pointed at stderr's file)."""
    global _channel
    if not active:
        yield
        return
    stdout = sys.stdout
    stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    channel = _channel = _DocumentStdout(sys.stderr)
    sys.stdout = channel
    try:
        yield
    finally:
        sys.stdout, _channel = stdout, None
        for stream in {id(s): s for s in (stdout, sys.__stdout__) if s is not None}.values():
            stream.flush()  # written through a reference to the old stdout kept meanwhile: to stderr, too
        _flush_c_stdio()
        channel.flush()
        os.dup2(saved, 1)
        os.close(saved)
        for document in channel.documents:
            stdout.write(document + "\n")
        stdout.flush()


def emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(to_json(payload) if args.json else text)


def report_error(args: argparse.Namespace, exc: CairnError) -> int:
    """One line on stderr; with --json also one JSON object on stdout. Returns the exit code."""
    if args.debug:
        traceback.print_exc()
    print(f"cairn: error: {exc.type_name}: {exc}", file=sys.stderr)
    if getattr(args, "json", False):
        error = {
            "type": exc.type_name,
            "message": str(exc),
            "field": exc.field,
            "expected": exc.expected,
            "found": exc.found,
            "retryable": exc.retryable,
            "exit_code": exc.exit_code,
        }
        print(to_json({"ok": False, "error": error}))
    return exc.exit_code


def report_usage_error(usage: str, words: Sequence[str], exc: CairnError) -> int:
    """A command line the parser refused: its usage on stderr, then the error, as JSON too when
    ``--json`` is among the words (nothing was parsed, so the words are all there is)."""
    sys.stderr.write(usage)
    return report_error(argparse.Namespace(json="--json" in words, debug=False), exc)


def report_dir(out: str | None, run_id: str) -> Path:
    """Where a report goes: an existing or creatable directory, checked before any work, as is
    matplotlib (the ``report`` extra), which draws it."""
    require_plots("writing a report (its PNG plots)")
    path = Path(out or f"cairn-report-{run_id}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".cairn-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            "--out", expected="a directory that can be written", found=f"{path} ({exc.strerror})"
        ) from None
    return path
