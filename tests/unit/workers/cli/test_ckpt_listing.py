"""Readable checkpoint listings: ``ckpt show``'s tensor table stays aligned whatever the tensor
names, and ``ckpt list`` is a table (step, kind, committed at, bytes, format, world size, pins)
with the same fields in ``--json``."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cairn.checkpoint import CheckpointRef, read_manifest, write_checkpoint
from cairn.checkpoint.commit import commit_manifest
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.retention import pin
from cairn.checkpoint.shards import new_save_nonce, write_shards
from cairn.stores import LocalStore
from tests.conftest import REPO, rewrite_manifest
from workers.cli.main import main
from workers.cli.table import display_width, table

CONFIG = str(REPO / "examples" / "config.json")
INFERENCE = CheckpointKind.INFERENCE
GPT_NAMES = (
    "param/transformer.h.0.attn.c_attn.weight",
    "param/transformer.h.11.mlp.c_proj.bias",
    "param/wte.weight",
    "b",
)
LIST_HEADERS = ("step", "kind", "committed at (UTC)", "bytes", "format", "world size", "pins", "checkpoint")
RIGHT = {"step", "bytes", "world size"}  # numbers: right-aligned


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _gpt_like(store: LocalStore) -> CheckpointRef:
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {
        GPT_NAMES[0]: rng.random((4, 12)).astype(np.float32),
        GPT_NAMES[1]: rng.random(300),
        GPT_NAMES[2]: rng.random((50, 8)).astype(np.float16),
        GPT_NAMES[3]: np.arange(3, dtype=np.int64),
    }
    return write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="gpt", step=7), tensors).ref


def _columns(header: str, names: tuple[str, ...], right: set[str]) -> dict[str, tuple[str, int]]:
    """Each column's anchor from the header line: its start (left-aligned) or end (right-aligned)."""
    spots = {}
    for name in names:
        at = header.index(name)
        spots[name] = ("end", at + len(name)) if name in right else ("start", at)
    return spots


def _assert_cell(line: str, spots: dict[str, tuple[str, int]], name: str, text: str) -> None:
    side, at = spots[name]
    if side == "start":
        assert line[at:].startswith(text) and (at == 0 or line[at - 1] == " "), (name, text, line)
    else:
        assert line[:at].endswith(text) and (at == len(line) or line[at] == " "), (name, text, line)


def test_show_aligns_every_tensor_column_with_long_tensor_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = LocalStore(tmp_path / "s")
    ref = _gpt_like(store)
    manifest = read_manifest(store, ref, expect_kind=None)
    code, out, _ = run(capsys, "ckpt", "show", str(ref))
    assert code == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == ["tensor", "dtype", "shape", "bytes", "checksum"])
    header, rows = lines[start], lines[start + 1 :]
    assert len(rows) == len(manifest.tensors) == 4
    spots = _columns(header, ("tensor", "dtype", "shape", "bytes", "checksum"), {"bytes"})
    by_name = {t.name: t for t in manifest.tensors}
    for line, name in zip(rows, sorted(by_name), strict=True):
        t = by_name[name]
        _assert_cell(line, spots, "tensor", t.name)
        _assert_cell(line, spots, "dtype", t.dtype)
        _assert_cell(line, spots, "shape", str(t.shape))
        _assert_cell(line, spots, "bytes", str(t.length))
        _assert_cell(line, spots, "checksum", t.checksum[:19])
    # the longest name did not push anything: every row's dtype starts at one offset past it
    assert spots["dtype"][1] >= 2 + len(GPT_NAMES[0]) + 2
    assert len({line.index(by_name[n].dtype, 2 + len(n)) for line, n in zip(rows, sorted(by_name), strict=True)}) == 1


def test_table_measures_terminal_cells_and_escapes_control_characters() -> None:
    assert (display_width("日本語"), display_width("e\u0301"), display_width("abc")) == (6, 1, 3)
    lines = table(["name", "n"], [["日本語", 1], ["a\nb\x1b[31m", 22], ["e\u0301", None]])
    # wide characters take two cells, a combining accent none; a newline or an escape sequence is
    # shown, not acted on; the number column ends at the same terminal cell in every row; None is '-'
    assert lines == [
        "name           n",
        "日本語         1",
        "a\\nb\\x1b[31m  22",
        "e\u0301              -",
    ], lines


def _parse_list(out: str, headers: tuple[str, ...]) -> tuple[list[dict[str, str]], str]:
    """The table's rows as {column: cell}, each cell checked to sit in its column; and the summary."""
    lines = out.splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    assert tuple(re.split(r" {2,}", header.strip())) == headers, header
    spots = _columns(header, headers, RIGHT)
    parsed = []
    for line in rows:
        cells = dict(zip(headers, re.split(r" {2,}", line.strip()), strict=True))
        for name, text in cells.items():
            _assert_cell(line, spots, name, text)
        parsed.append(cells)
    return parsed, summary


def _train(capsys: pytest.CaptureFixture[str], store: str, run_id: str, steps: int) -> None:
    code, out, err = run(
        capsys, "train", "--config", CONFIG, "--steps", str(steps), "--store", store,
        "--run-id", run_id, "--checkpoint-every", "2", "--json",
    )  # fmt: skip
    assert code == 0, err


def test_list_is_a_table_of_every_checkpoint_with_its_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "s")
    _train(capsys, root, "r", 6)
    store = LocalStore(root)
    refs = {r.step: r for r in (CheckpointRef.parse(f"{root}/r/training/{s:012d}") for s in (2, 4, 6))}
    pin(store, refs[4], "best")
    pin(store, refs[4], "release")
    code, out, err = run(capsys, "ckpt", "list", root, "--run", "r")
    assert code == 0 and err == ""
    rows, summary = _parse_list(out, LIST_HEADERS)
    assert [row["step"] for row in rows] == ["2", "4", "6"]
    total = 0
    for row in rows:
        ref = refs[int(row["step"])]
        manifest = read_manifest(store, ref, expect_kind=None)
        total += manifest.total_bytes
        committed = datetime.fromisoformat(manifest.writer.created_at).astimezone(UTC)
        assert row == {
            "step": str(ref.step),
            "kind": "training",
            "committed at (UTC)": committed.strftime("%Y-%m-%d %H:%M:%S"),
            "bytes": f"{manifest.total_bytes:,}",
            "format": "v1",
            "world size": "1",
            "pins": "best, release" if ref.step == 4 else "-",
            "checkpoint": str(ref),
        }
    assert summary == f"3 checkpoint(s), {total:,} bytes; pinned: best, release (training step 4)"

    _train(capsys, root, "q", 2)  # a second run: the whole store's listing names each row's run
    code, out, _ = run(capsys, "ckpt", "list", root)
    assert code == 0
    rows, _ = _parse_list(out, ("run", *LIST_HEADERS))
    assert [(row["run"], row["step"], row["pins"]) for row in rows] == [
        ("q", "2", "-"), ("r", "2", "-"), ("r", "4", "best, release"), ("r", "6", "-"),
    ]  # fmt: skip


def _two_ranks(store: LocalStore, step: int) -> CheckpointRef:
    content = CheckpointContent(kind=INFERENCE, run_id="mix", step=step)
    nonce = new_save_nonce()
    shards = [
        write_shards(store, content, {f"w{rank}": np.full(4, rank, dtype=np.float64)}, nonce=nonce, rank=rank)
        for rank in (0, 1)
    ]
    return commit_manifest(store, content, shards, nonce=nonce).ref


def test_list_json_has_every_field_of_each_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path / "s")
    arrays = {"param/transformer.h.0.attn.c_attn.weight": np.ones((8, 8)), "b": np.zeros(3)}
    v1 = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="mix", step=1), arrays).ref
    v2 = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="mix", step=2), arrays, block_bytes=64).ref
    ranks2 = _two_ranks(store, 3)
    pin(store, v2, "best")
    code, out, _ = run(capsys, "ckpt", "list", str(store.root), "--run", "mix", "--json")
    assert code == 0
    listed = json.loads(out)
    assert listed["store"] == store.url
    rows = listed["checkpoints"]
    assert [r["checkpoint"] for r in rows] == [str(v1), str(v2), str(ranks2)]
    expected: dict[str, list[Any]] = {"format_version": [1, 3, 1], "world_size": [1, 1, 2], "pins": [[], ["best"], []]}
    for i, (row, ref) in enumerate(zip(rows, (v1, v2, ranks2), strict=True)):
        manifest = read_manifest(store, ref, expect_kind=None)
        assert row == {
            "checkpoint": str(ref),
            "run_id": "mix",
            "kind": "inference",
            "step": ref.step,
            "committed_at": manifest.writer.created_at,
            "bytes": manifest.total_bytes,
            "format_version": expected["format_version"][i],
            "world_size": expected["world_size"][i],
            "pins": expected["pins"][i],
            "committed": True,
            "error": None,
        }
        assert datetime.fromisoformat(row["committed_at"]).tzinfo is not None


def test_a_foreign_manifest_is_listed_as_foreign_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path / "s")
    good = _gpt_like(store)
    bad = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="gpt", step=9), {"w": np.ones(2)}).ref
    rewrite_manifest(store, bad, lambda body: body.update(cursor=5), refingerprint=False)  # edited: fingerprint off
    code, out, err = run(capsys, "ckpt", "list", str(store.root), "--run", "gpt", "--json")
    assert code == 0
    rows = {r["step"]: r for r in json.loads(out)["checkpoints"]}
    assert rows[good.step]["error"] is None and rows[good.step]["bytes"] is not None
    assert rows[bad.step]["error"].startswith("IntegrityError: ") and rows[bad.step]["bytes"] is None
    assert rows[good.step]["committed"] and not rows[bad.step]["committed"]
    assert json.loads(out)["foreign"] == [str(bad)]
    assert f"warning: foreign: {bad}: IntegrityError" in err
    code, out, err = run(capsys, "ckpt", "list", str(store.root), "--run", "gpt")
    assert code == 0 and "1 object(s) at a manifest's key are not checkpoints Cairn committed" in err
    rows_text, _ = _parse_list(out, LIST_HEADERS)
    assert rows_text[1]["committed at (UTC)"] == "(foreign)" and rows_text[1]["bytes"] == "-"


def test_gc_on_a_signed_run_with_junk_manifests_deletes_nothing_genuine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported case: a signed run (steps 10 and 20 genuine), ``{}`` planted as the manifests
    of steps 30, 40 and 50, then ``cairn ckpt gc STORE --run R --keep-last 3 --grace-seconds 0``."""
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "k" * 32)
    store = LocalStore(tmp_path / "s")
    for step in (10, 20):
        content = CheckpointContent(kind=CheckpointKind.TRAINING, run_id="r", step=step)
        write_checkpoint(store, content, {"w": np.ones(2)})
    for step in (30, 40, 50):
        store.write_object(f"r/training/{step:012d}/manifest.json", [b"{}"])
    gc = ("ckpt", "gc", str(store.root), "--run", "r", "--keep-last", "3", "--grace-seconds", "0", "--json")
    code, out, err = run(capsys, *gc)
    assert code == 0
    plan = json.loads(out)
    assert plan["delete"] == [] and [k.rsplit("/", 1)[-1] for k in plan["keep"]] == ["000000000010", "000000000020"]
    assert [f["key"] for f in plan["foreign"]] == [f"r/training/{s:012d}/manifest.json" for s in (30, 40, 50)]
    assert "3 object(s) at a manifest's or a pin's key are not Cairn's" in err
    for step in (10, 20, 30, 40, 50):
        assert (store.root / f"r/training/{step:012d}/manifest.json").exists()
    code, out, err = run(capsys, "ckpt", "list", str(store.root), "--run", "r")
    assert code == 0 and "2 checkpoint(s)" in out and "3 foreign object(s)" in out
