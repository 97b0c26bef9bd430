"""Core hardening (issue 8): config semantics, signing-key configuration, lineage cross-checks,
memory bounds and safe keys on the read path, streaming verification, finite round-tripping
manifests, lineage in ``compare``, and dataset files that cannot allocate what they do not hold."""

from __future__ import annotations

import functools
import json
import math
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointRef, read_manifest, write_checkpoint
from cairn.checkpoint import reader as fmt
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.signing import signer_from_env
from cairn.config import DatasetConfig, TrainConfig, config_error_from, load_config, parse_config
from cairn.data import load_dataset
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from cairn.trainers.base import check_finite as check_training_values
from tests.conftest import guarded, refused_within_bounds, rewrite_manifest, small_config, write_broken

INFERENCE = CheckpointKind.INFERENCE


@pytest.fixture(autouse=True)
def no_signing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAIRN_SIGNING_KEY", raising=False)
    monkeypatch.delenv("CAIRN_SIGNING_KEY_FILE", raising=False)


# -- config: values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"optimizer": {"lr": math.inf}}, "optimizer.lr"),
        ({"optimizer": {"lr": 100.0}}, "optimizer.lr"),
        ({"optimizer": {"eps": 5.0}}, "optimizer.eps"),
        ({"optimizer": {"eps": math.inf}}, "optimizer.eps"),
        ({"optimizer": {"weight_decay": 1e6}}, "optimizer.weight_decay"),
        ({"optimizer": {"weight_decay": math.inf}}, "optimizer.weight_decay"),
        ({"optimizer": {"beta1": math.nan}}, "optimizer.beta1"),
        ({"data": {"noise": math.inf}}, "data.noise"),
        ({"model": {"init_scale": math.inf}}, "model.init_scale"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"data": {"seed": -1}}, "data.seed"),
    ],
)
def test_non_finite_or_absurd_values_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config(overrides, "cfg.json")
    assert info.value.field == field
    assert str(info.value).startswith(f"cfg.json: {field}: ")


def test_largest_seed_is_accepted() -> None:
    assert parse_config({"seed": 2**63 - 1, "data": {"seed": 0}}).seed == 2**63 - 1


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"model": {"hidden": 65536}, "data": {"n_features": 65536}}, "model too large"),
        (
            {"model": {"hidden": 1}, "data": {"n_examples": 10_000_000, "n_features": 65536}},
            "synthetic dataset too large",
        ),
        ({"batch_size": 1_000_000, "data": {"n_features": 4096}}, "batch too large"),
    ],
)
def test_sizes_that_cannot_fit_in_memory_are_refused_before_allocating(
    tmp_path: Path, overrides: dict[str, Any], needle: str
) -> None:
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(overrides))
    err = refused_within_bounds(lambda: load_config(path), E.ConfigError)
    assert needle in str(err) and "expected <= " in str(err) and "found " in str(err)


def test_a_model_at_the_bound_is_accepted() -> None:
    # 2048 x 65536 + 65536 x 2 + biases ~ 2**27: parsing allocates nothing.
    assert parse_config({"model": {"hidden": 2040}, "data": {"n_features": 65536, "n_classes": 2}})


# -- config: unknown fields ----------------------------------------------------------------


def test_unknown_field_suggests_the_closest_name() -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config({"optimizer": {"wieght_decay": 0.1}}, "cfg.json")
    assert str(info.value) == (
        "cfg.json: optimizer.wieght_decay: Extra inputs are not permitted — did you mean 'weight_decay'? (found 0.1)"
    )
    assert info.value.field == "optimizer.wieght_decay"


def test_unknown_field_without_a_close_name_gets_no_guess() -> None:
    with pytest.raises(E.ConfigError) as info:
        parse_config({"zzzzzz": 1}, "cfg.json")
    assert "did you mean" not in str(info.value) and "zzzzzz" in str(info.value)


def test_run_input_typos_suggest_the_field_at_their_location() -> None:
    from activities.models import TrainingRunInput
    from tests.conftest import REPO

    base = json.loads((REPO / "examples" / "run.json").read_text())
    cases: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
        (lambda b: b["checkpoint"].update(evry=3), "checkpoint.evry", "every"),
        (lambda b: b.update(run_ide=b.pop("run_id")), "run_ide", "run_id"),  # reported instead of "run_id missing"
        (lambda b: b["config"]["optimizer"].update(beta=0.9), "config.optimizer.beta", "beta"),
    ]
    for mutate, loc, suggestion in cases:
        body = json.loads(json.dumps(base))
        mutate(body)
        with pytest.raises(ValidationError) as info:
            TrainingRunInput.model_validate(body)
        message = str(config_error_from(info.value, "run.json", TrainingRunInput))
        assert message.startswith(f"run.json: {loc}: Extra inputs are not permitted — did you mean '{suggestion}")
        assert "\n" not in message and "(found " in message


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    weight: float = 0.0


class _Holder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[_Item] = []
    by_key: dict[str, _Item] = {}
    maybe: _Item | None = None


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"items": [{}, {"nmae": "x"}]}, "items.1.nmae"),
        ({"by_key": {"k": {"nmae": "x"}}}, "by_key.k.nmae"),
        ({"maybe": {"nmae": "x"}}, "maybe.nmae"),
        ({"itmes": []}, "itmes"),
    ],
)
def test_suggestions_work_for_any_model(body: dict[str, Any], loc: str) -> None:
    with pytest.raises(ValidationError) as info:
        _Holder.model_validate(body)
    message = str(config_error_from(info.value, "in", _Holder))
    want = "items" if loc == "itmes" else "name"
    assert message.startswith(f"in: {loc}: Extra inputs are not permitted — did you mean '{want}'?"), message


# -- signing key configuration ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["CAIRN_SIGNING_KEY", "CAIRN_SIGNING_KEY_FILE"])
def test_set_but_empty_signing_variable_is_not_signing_off(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "")
    with pytest.raises(E.ConfigError) as info:
        signer_from_env()
    assert info.value.field == name


def test_unset_signing_variables_mean_no_signing() -> None:
    assert signer_from_env() is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-null-symlink"])
def test_signing_key_file_must_be_a_regular_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    path = tmp_path / "key"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    monkeypatch.setenv("CAIRN_SIGNING_KEY_FILE", str(path))
    err = refused_within_bounds(signer_from_env, E.ConfigError)
    assert "not a regular file" in str(err) and str(path) in str(err)


# -- lineage cross-checks on import ----------------------------------------------------------


@pytest.mark.parametrize("field", ["tokenizer_version", "dataset_version"])
def test_lineage_must_agree_with_the_config(local_store: LocalStore, config: TrainConfig, field: str) -> None:
    victim = TrainingSession.fresh("victim", local_store, config)
    victim.run(3)
    before = victim.state.copy()
    lineage = victim.state.lineage.model_copy(update={field: "forged"})
    ref = write_broken(local_store, "broken", victim.state, lineage=lineage)
    with pytest.raises(E.InvariantError) as info:
        victim.restore(ref)
    assert info.value.field == f"lineage.{field}" and info.value.found == "forged"
    assert compare_states(victim.state, before) == []


# -- memory bounds and safe keys on the read path -------------------------------------------


def _inference(store: MemoryStore | LocalStore, tensors: dict[str, np.ndarray], run: str = "forge") -> CheckpointRef:
    content = CheckpointContent(kind=INFERENCE, run_id=run, step=1)
    return write_checkpoint(store, content, tensors).ref


def _load(store: MemoryStore | LocalStore, ref: CheckpointRef) -> None:
    manifest = read_manifest(store, ref, expect_kind=INFERENCE)
    fmt.read_tensors(store, ref, manifest)


@pytest.mark.parametrize("shape", [[2**62, 0], [0, 2**70], [2**41, 0, 3]])
def test_absurd_shapes_are_refused_before_allocating(memory_store: MemoryStore, shape: list[int]) -> None:
    ref = _inference(memory_store, {"empty": np.zeros((0, 3))})
    rewrite_manifest(memory_store, ref, lambda m: m["tensors"][0].update(shape=shape))
    with pytest.raises(E.TensorSpecError) as info:
        _load(memory_store, ref)
    assert info.value.field == "tensors[empty].shape"


UNSAFE_KEYS = ["../escape.bin", "a/../../b.bin", "./a.bin", "a//b.bin", "/abs.bin", "a\x00b", "a\nb", "a\\b", "", "a/"]


@pytest.mark.parametrize("key", UNSAFE_KEYS)
def test_unsafe_shard_keys_are_content_errors(local_store: LocalStore, key: str) -> None:
    ref = _inference(local_store, {"w": np.arange(3.0)})

    def evil(m: dict[str, Any]) -> None:
        m["shards"][0]["key"] = key
        for t in m["tensors"]:
            t["shard"] = key

    rewrite_manifest(local_store, ref, evil)
    with pytest.raises(E.ManifestError) as info:
        _load(local_store, ref)
    assert not info.value.retryable and "shard" in str(info.value)


def test_a_shard_listed_twice_is_refused(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"w": np.arange(3.0)})
    rewrite_manifest(memory_store, ref, lambda m: m["shards"].append(dict(m["shards"][0])))
    with pytest.raises(E.ManifestError):
        _load(memory_store, ref)


def test_a_deeply_nested_manifest_is_a_manifest_error(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"w": np.arange(3.0)})
    key = f"{ref.prefix}/manifest.json"
    raw = memory_store.read(key)
    memory_store.corrupt(key, raw[:-2] + b', "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(E.ManifestError, match="nested too deep"):
        read_manifest(memory_store, ref, expect_kind=INFERENCE)


# -- streaming verification ------------------------------------------------------------------

TENSORS = {
    "a": np.arange(10, dtype="<f8"),
    "b": np.arange(7, dtype="<i4"),
    "c": np.zeros((0, 4)),
    "d": np.array(3.5),
    "e": np.linspace(0, 1, 15, dtype=np.float32).reshape(3, 5),
    "f": np.arange(5, dtype=np.uint8),
}


@pytest.mark.parametrize("chunk_bytes", [1, 12, 24, 8 << 20])
def test_verify_tensors_streams_whole_elements(memory_store: MemoryStore, chunk_bytes: int) -> None:
    ref = _inference(memory_store, TENSORS)
    manifest = read_manifest(memory_store, ref, expect_kind=INFERENCE)
    seen: dict[str, list[np.ndarray]] = {}

    def record(name: str, chunk: np.ndarray) -> None:
        assert chunk.ndim == 1 and chunk.dtype == TENSORS[name].dtype
        assert chunk.nbytes <= max(chunk_bytes, 8)
        seen.setdefault(name, []).append(chunk.copy())

    fmt.verify_tensors(memory_store, ref, manifest, value_check=record, chunk_bytes=chunk_bytes)
    for name, arr in TENSORS.items():
        got = np.concatenate(seen[name]) if name in seen else np.empty(0, arr.dtype)
        assert got.tobytes() == arr.tobytes(), name


def test_verify_tensors_refuses_corruption_and_bad_values(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"theta/w": np.array([1.0, np.nan, 2.0]), "x": np.arange(4.0)})
    manifest = read_manifest(memory_store, ref, expect_kind=INFERENCE)
    with pytest.raises(E.NonFiniteError):
        fmt.verify_tensors(memory_store, ref, manifest, value_check=check_training_values, chunk_bytes=8)
    shard = f"{ref.prefix}/{manifest.shards[0].key}"
    raw = bytearray(memory_store.read(shard))
    raw[-1] ^= 0x40
    memory_store.corrupt(shard, bytes(raw))
    with pytest.raises(E.IntegrityError, match="checksum"):
        fmt.verify_tensors(memory_store, ref, manifest)


def _forge_huge(store: LocalStore, *, shard_size: int) -> CheckpointRef:
    """A checkpoint whose manifest declares a 58 GiB tensor in a sparse shard file."""
    ref = _inference(store, {"a": np.arange(4.0)})
    huge = 58 << 30
    key = "zz/huge.bin"

    def forge(m: dict[str, Any]) -> None:
        m["shards"].append({"key": key, "rank": 0, "bytes": huge})
        m["tensors"].append(
            {
                "name": "huge",
                "dtype": "<f8",
                "shape": [huge // 8],
                "shard": key,
                "offset": 0,
                "length": huge,
                "checksum": "blake3:" + "0" * 64,
            }
        )
        m["total_bytes"] = sum(t["length"] for t in m["tensors"])

    rewrite_manifest(store, ref, forge)
    path = store.root / ref.prefix / key
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(shard_size)  # sparse: no disk used
    return ref


@pytest.mark.parametrize("fault", ["bad-checksum-first", "missing-bytes"])
def test_verify_a_forged_58_gib_checkpoint_in_bounded_memory(local_store: LocalStore, fault: str) -> None:
    ref = _forge_huge(local_store, shard_size=(58 << 30) if fault == "bad-checksum-first" else 1 << 20)
    manifest = read_manifest(local_store, ref, expect_kind=INFERENCE)  # within the 64 GiB bound
    if fault == "bad-checksum-first":
        small = next(s for s in manifest.shards if s.key != "zz/huge.bin")
        path = local_store.root / ref.prefix / small.key
        path.write_bytes(b"\xff" * path.stat().st_size)
    err = refused_within_bounds(lambda: fmt.verify_tensors(local_store, ref, manifest), E.IntegrityError)
    assert ("tensors[a].checksum" if fault == "bad-checksum-first" else "shards[zz/huge.bin].bytes") in str(err)


# -- finite, round-tripping manifests --------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        ({"meta": {"loss": math.nan}}, "meta.loss"),
        ({"config": {"optimizer": {"lr": math.inf}}}, "config.optimizer.lr"),
        ({"rng": {"state": [1.0, -math.inf]}}, "rng.state[1]"),
    ],
)
def test_non_finite_content_is_refused_before_anything_is_written(
    memory_store: MemoryStore, change: dict[str, Any], field: str
) -> None:
    content = CheckpointContent(kind=INFERENCE, run_id="nf", step=1, **change)
    with pytest.raises(E.InvariantError) as info:
        write_checkpoint(memory_store, content, {"w": np.ones(3)})
    assert info.value.field == field
    assert list(memory_store.list()) == []


def test_fingerprint_has_no_form_for_non_finite_values() -> None:
    with pytest.raises(E.InvariantError) as info:
        CheckpointContent(kind=INFERENCE, run_id="nf", step=0, meta={"x": math.inf}).fingerprint([])
    assert info.value.field == "meta.x"


@pytest.mark.parametrize(
    "meta",
    [{"big": 10**70}, {"s": "\ud800"}, {"deep": json.loads("[" * 70 + "]" * 70)}, {"o": object()}],
    ids=["70-digit-int", "lone-surrogate", "70-deep", "not-json"],
)
def test_content_the_reader_would_refuse_is_not_committed(memory_store: MemoryStore, meta: dict[str, Any]) -> None:
    content = CheckpointContent(kind=INFERENCE, run_id="rt", step=1, meta=meta)
    with pytest.raises(E.InvariantError):
        write_checkpoint(memory_store, content, {"w": np.ones(2)})
    assert list(memory_store.list()) == []


@pytest.mark.parametrize("kind", ["too-many-tensors", "too-many-dims", "too-many-bytes"])
def test_tensors_over_the_read_bounds_are_not_written(memory_store: MemoryStore, kind: str) -> None:
    if kind == "too-many-tensors":
        tensors = {f"t{i}": np.zeros(1) for i in range(4097)}
        error: type[E.CheckpointError] = E.SizeLimitError
    elif kind == "too-many-dims":
        tensors, error = {"t": np.zeros((1,) * 9)}, E.TensorSpecError
    else:  # a 65 GiB view of one element: refused from its size, never copied
        tensors, error = {"t": np.broadcast_to(np.zeros(1), ((65 << 30) // 8,))}, E.SizeLimitError
    content = CheckpointContent(kind=INFERENCE, run_id="big", step=1)
    refused_within_bounds(lambda: write_checkpoint(memory_store, content, tensors), error)
    assert list(memory_store.list()) == []


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**70), 10**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "é", "\\", '"', "[{"])
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


JSON_OBJECTS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_OBJECTS, st.none() | JSON_OBJECTS, st.none() | JSON_OBJECTS, st.integers(0, 10**6))
def test_a_commit_either_reads_back_to_the_same_fingerprint_or_never_happens(
    meta: dict[str, Any], rng: dict[str, Any] | None, config: dict[str, Any] | None, step: int
) -> None:
    store = MemoryStore()
    content = CheckpointContent(
        kind=INFERENCE, run_id="prop", step=step, cursor=step, meta=meta, rng=rng, config=config
    )
    try:
        committed = write_checkpoint(store, content, {"w": np.arange(3.0)})
    except E.InvariantError:
        assert list(store.list()) == []
        return
    manifest = read_manifest(store, committed.ref, expect_kind=INFERENCE)
    assert manifest.fingerprint == committed.manifest.fingerprint
    assert json.dumps(manifest.meta, sort_keys=True) == json.dumps(meta, sort_keys=True)
    assert json.dumps(manifest.rng, sort_keys=True) == json.dumps(rng, sort_keys=True)
    assert json.dumps(manifest.config, sort_keys=True) == json.dumps(config, sort_keys=True)


# -- compare covers lineage ----------------------------------------------------------------


def test_compare_reports_each_lineage_field_but_not_parent(local_store: LocalStore, config: TrainConfig) -> None:
    state = TrainingSession.fresh("cmp", local_store, config).state
    other = state.copy()
    other.lineage = state.lineage.model_copy(update={"parent": "sha256:" + "1" * 64})
    assert compare_states(state, other) == []
    other.lineage = state.lineage.model_copy(
        update={"dataset_version": "edited", "final_test_exposures": 3, "parent": "sha256:" + "2" * 64}
    )
    fields = {d.field for d in compare_states(state, other)}
    assert fields == {"lineage.dataset_version", "lineage.final_test_exposures"}


# -- dataset files ---------------------------------------------------------------------------


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _file_config(path: Path) -> DatasetConfig:
    return small_config(data={"source": "file", "path": str(path), "n_features": 4, "n_classes": 3}).data


def test_a_dataset_header_that_lies_is_refused_before_allocating(tmp_path: Path) -> None:
    import zipfile

    lie = _npy_header((10**11, 5)) + b"\0" * 64  # declares 3.6 TiB in 200 bytes
    npy = tmp_path / "lie.npy"
    npy.write_bytes(lie)
    npz = tmp_path / "lie.npz"
    with zipfile.ZipFile(npz, "w") as archive:
        archive.writestr("x.npy", lie)
        archive.writestr("y.npy", _npy_header((3,), "<i8") + b"\0" * 24)
    for path in (npy, npz):
        err = refused_within_bounds(functools.partial(load_dataset, _file_config(path)), E.ConfigError)
        assert "declares more data than it holds" in str(err)


@pytest.mark.parametrize("kind", ["strings", "nan-labels", "complex"])
def test_dataset_values_must_be_numeric_and_finite(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "data.npz"
    x = np.zeros((6, 4))
    if kind == "strings":
        np.savez(path, x=x.astype(str), y=np.zeros(6, dtype=np.int64))
    elif kind == "nan-labels":
        np.savez(path, x=x, y=np.array([0.0, 1.0, np.nan, 2.0, 0.0, 1.0]))
    else:
        np.savez(path, x=x.astype(np.complex128), y=np.zeros(6, dtype=np.int64))
    with pytest.raises(E.ConfigError):
        load_dataset(_file_config(path))


def test_dataset_path_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    exc = guarded(lambda: load_dataset(_file_config(fifo)))
    assert isinstance(exc, E.ConfigError) and "FIFO" in str(exc)


def test_a_good_dataset_file_still_loads_and_hashes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 4)), rng.integers(0, 3, 20)
    np.savez_compressed(tmp_path / "d.npz", x=x, y=y)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    a = load_dataset(_file_config(tmp_path / "d.npz"))
    b = load_dataset(_file_config(tmp_path / "d.npy"))
    assert a.content_hash == b.content_hash and a.x.shape == (20, 4)


def test_memory_bound_of_refusals_is_measured() -> None:
    """The helpers above measure allocations: a 100 MiB array is seen (sanity of tracemalloc)."""
    tracemalloc.start()
    try:
        np.ones(100 << 17)
        assert tracemalloc.get_traced_memory()[1] >= 100 << 20
    finally:
        tracemalloc.stop()
