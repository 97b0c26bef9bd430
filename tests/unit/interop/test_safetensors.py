"""The safetensors format as written by Cairn's streaming writer and read under limits: files the
reference library reads back exactly (every dtype, bf16 included), and hostile headers refused
with a typed error before anything is allocated."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

from cairn import errors as E
from cairn.checkpoint.tensors import BFLOAT16, dtype_tag
from cairn.interop.safetensors import TO_SAFETENSORS, header_bytes, plan_files, read_header
from tests.conftest import refused_within_bounds

ARRAYS = {
    "a.f64": np.arange(6, dtype="<f8").reshape(2, 3),
    "b.f32": np.linspace(-1, 1, 7, dtype="<f4"),
    "c.bf16": np.linspace(-2, 2, 5).astype(BFLOAT16),
    "d.f16": np.ones((2, 2), dtype="<f2"),
    "e.i64": np.array([1, -2, 3], dtype="<i8"),
    "f.bool": np.array([True, False]),
    "g.empty": np.zeros((0, 4), dtype="<f4"),
}


def write(path: Path, arrays: dict[str, np.ndarray], max_file_bytes: int = 1 << 30) -> list[Path]:
    specs = {k: (dtype_tag(a.dtype), a.shape) for k, a in arrays.items()}
    out = []
    for plan in plan_files(specs, "model", max_file_bytes):
        with open(path / plan.name, "wb") as f:
            f.write(header_bytes(plan, {"format": "pt"}))
            for key in plan.tensors:
                f.write(np.ascontiguousarray(arrays[key]).tobytes())
        out.append(path / plan.name)
    return out


def test_the_reference_reader_loads_what_the_writer_streams(tmp_path: Path) -> None:
    (path,) = write(tmp_path, ARRAYS)
    loaded = load_file(str(path))
    assert set(loaded) == set(ARRAYS)
    for key, arr in ARRAYS.items():
        t = loaded[key]
        got = t.view(torch.int16).numpy().view(BFLOAT16) if t.dtype == torch.bfloat16 else t.numpy()
        assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes(), key
    with open(path, "rb") as f:
        entries, metadata = read_header(f, "x")
    assert metadata == {"format": "pt"} and {k: e.shape for k, e in entries.items()} == {
        k: a.shape for k, a in ARRAYS.items()
    }
    assert set(TO_SAFETENSORS.values()) >= {"BF16", "F32", "BOOL"}


def test_large_exports_are_sharded_in_key_order(tmp_path: Path) -> None:
    arrays = {f"w{i}": np.full(256, i, dtype="<f4") for i in range(5)}  # 1 KiB each
    files = write(tmp_path, arrays, max_file_bytes=2048)
    assert [p.name for p in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(k for p in files for k in load_file(str(p))) == sorted(arrays)


def test_a_header_the_reference_library_writes_reads_the_same(tmp_path: Path) -> None:
    save_file({"x": np.arange(4, dtype="<f4")}, str(tmp_path / "ref.safetensors"), metadata={"k": "v"})
    with open(tmp_path / "ref.safetensors", "rb") as f:
        entries, metadata = read_header(f, "ref")
    assert entries["x"].shape == (4,) and entries["x"].dtype == "<f4" and metadata == {"k": "v"}


def hostile(tmp_path: Path, header: object, data: bytes = b"\0" * 16, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "length", "needle"),
    [
        ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 1 << 40, "header"),
        ({"x": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, None, "dtype"),
        ({"x": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 16]}}, None, "data_offsets"),
        ({"x": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, None, "data_offsets"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 16]}}, None, "shape"),
        (
            {
                "x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                "y": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
            },
            None,
            "overlap",
        ),
        ({"x": {"dtype": "F32", "shape": [4]}}, None, "data_offsets"),
        ([1, 2], None, "JSON object"),
        ({"__metadata__": {"k": 1}}, None, "__metadata__"),
    ],
)
def test_hostile_headers_are_refused_before_anything_is_allocated(
    tmp_path: Path, header: object, length: int | None, needle: str
) -> None:
    path = hostile(tmp_path, header, length=length)
    with open(path, "rb") as f, pytest.raises(E.CairnError) as info:
        read_header(f, "bad")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_header_of_a_million_empty_entries_is_refused_by_its_count_before_parsing(tmp_path: Path) -> None:
    """~100 MiB of ``"kN":{}`` entries: refused by the entry budget the reader declares (here the
    three tensors a model has), within the memory bound, before ``json.loads`` builds a dict."""
    entries = b",".join(b'"k%d":{}' % i for i in range(1_790_000))
    raw = b"{" + entries + b"}"
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "many.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)

    def read() -> None:
        with open(path, "rb") as f:
            read_header(f, "many", max_entries=3)

    exc = refused_within_bounds(read, E.TensorSpecError)
    assert "more entries than expected" in str(exc) and "<= " in str(exc)


def test_the_entry_budget_admits_exactly_the_expected_count(tmp_path: Path) -> None:
    header = {f"w{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(3)}
    path = hostile(tmp_path, {"__metadata__": {"format": "pt"}, **header}, data=b"\0" * 12)
    with open(path, "rb") as f:
        entries, _ = read_header(f, "ok", max_entries=3)
    assert sorted(entries) == ["w0", "w1", "w2"]
    with open(path, "rb") as f, pytest.raises(E.TensorSpecError, match="more tensors than expected"):
        read_header(f, "ok", max_entries=2)
