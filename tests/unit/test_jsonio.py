"""Hostile JSON and hostile files at every entry point: each is refused with the entry point's
own typed error, promptly and in bounded memory; nothing escapes as RecursionError, ValueError,
UnicodeDecodeError or MemoryError, and nothing blocks (a FIFO) or reads forever (/dev/zero)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn import errors as E
from cairn.checkpoint.reader import parse_manifest
from cairn.config import load_config
from cairn.jsonio import JsonLimits, load_json_file, parse_json, read_regular_file
from tests.conftest import refused_within_bounds


def _deep(n: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * n + b"]" * n
    if kind == "object":
        return b'{"a":' * n + b"1" + b"}" * n
    return b'{"a":[' * (n // 2) + b"0" + b"]}" * (n // 2)  # mixed


DEEP = st.tuples(st.sampled_from([1_000, 100_000]), st.sampled_from(["array", "object", "mixed"])).map(
    lambda t: _deep(*t)
)
HUGE_INT = st.sampled_from([65, 4_301, 5_000]).map(lambda n: b'{"seed": ' + b"7" * n + b"}")
NON_FINITE = st.sampled_from(
    [b"NaN", b"[Infinity]", b'{"lr": -Infinity}', b"1e400", b"[-1e400]", b'{"optimizer": {"lr": 1.5e309}}']
)
NOT_UTF8 = st.binary(min_size=1, max_size=64).filter(lambda b: not _is_utf8(b))
UTF8_BROKEN_IN_JSON = (
    st.binary(min_size=1, max_size=16).filter(lambda b: not _is_utf8(b)).map(lambda b: b'{"stage": "' + b + b'"}')
)
LONE_SURROGATE = st.sampled_from([b'"\\ud800"', b'{"stage": "\\udfff"}', b'["ok", "\\ud83d"]'])
HOSTILE = st.one_of(DEEP, HUGE_INT, NON_FINITE, NOT_UTF8, UTF8_BROKEN_IN_JSON, LONE_SURROGATE)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@SETTINGS
@given(HOSTILE)
def test_hostile_json_is_refused_at_every_entry_point(raw: bytes) -> None:
    refused_within_bounds(lambda: parse_json(raw, where="doc"), E.ConfigError)
    refused_within_bounds(lambda: parse_manifest(raw, "store/run/training/000000000001"), E.ManifestError)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(HOSTILE)
def test_hostile_config_file_is_a_config_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    err = refused_within_bounds(lambda: load_config(path), E.ConfigError)
    assert str(path) in str(err)


JSONISH = st.text(alphabet='[]{}",:0123456789eE.-+ \\/abfnrtuNIaINfinity', max_size=200)


@SETTINGS
@given(st.one_of(st.binary(max_size=200), JSONISH.map(str.encode)))
def test_arbitrary_bytes_parse_or_fail_typed(raw: bytes) -> None:
    """Whatever the bytes, the outcome is a value or the entry point's typed error."""
    with contextlib.suppress(E.ConfigError):
        parse_json(raw, where="doc")
    with contextlib.suppress(E.CheckpointError):
        parse_manifest(raw, "store/run/training/000000000001")


def test_error_messages_say_what_was_wrong() -> None:
    cases = {
        b"[" * 100_000: "nested too deep",
        b"1" * 5_000: "integer too long",
        b"\xff\xfe\x00": "not UTF-8 text (binary file?)",
        b"[NaN]": "NaN",
        b"1e400": "overflows to infinity",
        b"{": "not valid JSON (line 1, column 2",
        b'"\\ud800"': "surrogate",
    }
    for raw, needle in cases.items():
        with pytest.raises(E.ConfigError) as info:
            parse_json(raw, where="cfg.json")
        assert str(info.value).startswith("cfg.json") and needle in str(info.value), str(info.value)


def test_limits_are_configurable_and_exact() -> None:
    ok = b'{"a": [[["' + b"x" * 10 + b'"]]], "n": ' + b"9" * 5 + b"}"
    assert parse_json(ok, where="d", limits=JsonLimits(max_depth=4, max_int_digits=5, max_string_chars=10))
    for limits in (JsonLimits(max_depth=3), JsonLimits(max_int_digits=4), JsonLimits(max_string_chars=9)):
        with pytest.raises(E.ConfigError):
            parse_json(ok, where="d", limits=limits)
    with pytest.raises(E.ConfigError, match="too large"):
        parse_json(ok, where="d", limits=JsonLimits(max_bytes=len(ok) - 1))


def test_brackets_and_escapes_inside_strings_do_not_count_as_depth() -> None:
    raw = json.dumps({"s": "[[[[{{{{" * 100, "t": 'x\\"[[[[', "u": "\\\\", "v": ["\\"]}).encode()
    assert parse_json(raw, where="d", limits=JsonLimits(max_depth=2))["t"] == 'x\\"[[[['


@SETTINGS
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(10**20), 10**20)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=30,
    )
)
def test_every_bounded_document_parses_like_json_loads(value: Any) -> None:
    raw = json.dumps(value).encode()
    assert parse_json(raw, where="d") == json.loads(raw)


# -- hostile files -------------------------------------------------------------------------


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


def _link(target: str) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        if not os.path.exists(target):
            pytest.skip(f"{target} not present")
        path = tmp_path / "link.json"
        path.symlink_to(target)
        return path

    return make


def _directory(tmp_path: Path) -> Path:
    path = tmp_path / "dir.json"
    path.mkdir()
    return path


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "missing.json"


def _oversized(tmp_path: Path) -> Path:
    path = tmp_path / "big.json"
    with path.open("wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: costs no disk
    return path


SPECIAL_FILES = {
    "fifo": (_fifo, "FIFO"),
    "dev-zero-symlink": (_link("/dev/zero"), "character device"),
    "dev-urandom-symlink": (_link("/dev/urandom"), "character device"),
    "dev-zero": (lambda _: Path("/dev/zero"), "character device"),
    "directory": (_directory, "directory"),
    "missing": (_missing, "not found"),
    "oversized": (_oversized, "too large"),
}


@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
def test_special_files_are_refused_promptly(tmp_path: Path, kind: str) -> None:
    make, needle = SPECIAL_FILES[kind]
    path = make(tmp_path)
    for fn, error in (
        (lambda: read_regular_file(path, what="input", max_bytes=16 << 20), E.ConfigError),
        (lambda: load_json_file(path, what="input"), E.ConfigError),
        (lambda: load_config(path), E.ConfigError),
        (lambda: read_regular_file(path, what="manifest", max_bytes=16 << 20, error=E.ManifestError), E.ManifestError),
    ):
        err = refused_within_bounds(fn, error)
        assert str(path) in str(err) and needle in str(err), str(err)


def test_symlink_to_a_regular_file_is_the_users_file(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text('{"seed": 3}')
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert load_config(link).seed == 3
    assert read_regular_file(link, what="x", max_bytes=11) == b'{"seed": 3}'
    with pytest.raises(E.ConfigError, match="too large"):
        read_regular_file(link, what="x", max_bytes=10)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0)
    with pytest.raises(E.ConfigError, match="cannot read"):
        load_config(path)
