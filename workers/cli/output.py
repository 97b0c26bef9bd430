"""What every ``cairn`` command prints: its result as text or as one JSON object (``--json``,
always valid JSON), its error as one line on stderr (and as JSON with ``--json``), and where a
report's files go."""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cairn.errors import CairnError, ConfigError

__all__ = ["CommandFailed", "emit", "report_dir", "report_error", "report_usage_error", "to_json"]


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
    return json.dumps(_finite(payload), sort_keys=True, default=str, allow_nan=False)


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
    """Where a report goes: an existing or creatable directory, checked before any work."""
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
