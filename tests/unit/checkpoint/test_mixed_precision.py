"""bfloat16 and float16 tensors in checkpoints (``cairn.checkpoint.tensors.dtype_tag``): stored
natively at 2 bytes an element, restored bit for bit through the manager (v1) and the blocked
layout (v2), and checked on import like every other tensor: checksums, the trainer's declared
dtypes (bf16 is not fp16), finite values, and only known dtype tags."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointRef, read_manifest, verify_tensors
from cairn.checkpoint import tensors as tensors_module
from cairn.checkpoint.blocks import base_name
from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.tensors import (
    ALLOWED_DTYPES,
    BFLOAT16,
    TensorSpec,
    as_le_contiguous,
    dtype_from_tag,
    dtype_tag,
    is_floating,
)
from cairn.checkpoint.training import training_content, training_tensors
from cairn.config import TrainConfig
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.trainers.base import check_finite
from cairn.trainers.loading import load_trainer
from cairn.trainers.mlp import MLPTrainer
from cairn.training import save_training
from cairn.training.manager import load_training
from tests.conftest import dist_config, rewrite_manifest, rewrite_rank_index, small_config

pytestmark = pytest.mark.usefixtures("no_signing_key")

BF16, F16 = "bfloat16", "<f2"
HALF_TENSORS = {"theta/W1": BF16, "adam.m/W1": BF16, "theta/W2": F16, "adam.m/W2": F16}
"""The tensors the mixed-precision trainer keeps in 16 bits; the rest stay float64."""


class MixedPrecisionMLP(MLPTrainer):
    """The built-in MLP, declaring some of its tensors in bfloat16 or float16."""

    half: Mapping[str, str] = HALF_TENSORS

    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        specs = super().tensor_specs(step, meta)
        return {name: TensorSpec(self.half.get(name, s.dtype), s.shape) for name, s in specs.items()}


def _trainer(config: TrainConfig, half: Mapping[str, str] = HALF_TENSORS) -> MixedPrecisionMLP:
    built = load_trainer(config)
    trainer = MixedPrecisionMLP(built.config, built.options)
    trainer.half = half
    return trainer


def _state(config: TrainConfig, half: Mapping[str, str] = HALF_TENSORS) -> TrainState:
    """A state after 4 updates, its half tensors cast to their 16-bit dtypes, with a few
    special finite values (signed zero, the largest finite, a subnormal) kept bit for bit."""
    trainer = load_trainer(config)
    state = trainer.train(trainer.init_state(), 4)
    for name, tag in half.items():
        arr = state.tensors[name].astype(dtype_from_tag(tag))
        flat = arr.reshape(-1)
        finfo = ml_dtypes.finfo(arr.dtype)
        flat[:3] = np.array([-0.0, float(finfo.max), float(finfo.smallest_subnormal)]).astype(arr.dtype)
        state.tensors[name] = arr
    return state


def _bits(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).view(np.uint16 if arr.itemsize == 2 else np.uint8)


CONFIGS = {"v1": small_config, "blocked": dist_config}


@pytest.mark.parametrize("tag", sorted(ALLOWED_DTYPES))
def test_every_allowed_tag_names_one_dtype_and_back(tag: str) -> None:
    assert dtype_tag(dtype_from_tag(tag)) == tag


def test_bfloat16_is_tagged_by_name_and_ambiguous_or_unknown_dtypes_are_refused() -> None:
    assert np.dtype(ml_dtypes.bfloat16).str == "<V2"  # why the manifest needs a tag
    assert dtype_tag(ml_dtypes.bfloat16) == BF16 and dtype_from_tag(BF16) == BFLOAT16
    assert dtype_tag(np.float16) == F16 and is_floating(BFLOAT16) and not is_floating(np.uint16)
    big = np.arange(4, dtype=np.float32).astype(BFLOAT16.newbyteorder(">"))
    assert _bits(as_le_contiguous(big)).tolist() == _bits(np.arange(4, dtype=np.float32).astype(BFLOAT16)).tolist()
    for other in (np.zeros(2, "V2"), np.zeros(2, ml_dtypes.float8_e4m3fn), np.zeros(2, np.complex64)):
        with pytest.raises(E.TensorSpecError) as info:
            as_le_contiguous(other)
        assert info.value.field == "dtype" and info.value.found == dtype_tag(other.dtype)


@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_bf16_and_fp16_round_trip_bit_exact_at_two_bytes_an_element(local_store: LocalStore, layout: str) -> None:
    config = CONFIGS[layout]()
    state = _state(config)
    result = save_training(local_store, "mixed", state)
    manifest = read_manifest(local_store, result.ref, expect_kind=CheckpointKind.TRAINING)
    assert manifest.format_version == (3 if layout == "blocked" else 1)
    entries = [t for t in manifest.tensors if base_name(t.name) in HALF_TENSORS]
    assert {t.dtype for t in entries} == {BF16, F16}
    for name, tag in HALF_TENSORS.items():  # stored natively: 2 bytes an element, never widened
        mine = [t for t in entries if base_name(t.name) == name]
        assert {t.dtype for t in mine} == {tag}
        assert sum(t.length for t in mine) == 2 * state.tensors[name].size
    stored = sum(o.size for o in local_store.list(result.ref.prefix) if not o.key.endswith(".json"))
    # the state's tensors: its history is in the run's history segments, not under the prefix
    assert stored == manifest.total_bytes == sum(a.nbytes for a in state.tensors.values())
    first = next(t for t in manifest.tensors if t.name in ("theta/W1", "theta/W1#00000"))
    raw = local_store.read(f"{result.ref.prefix}/{first.shard}", 1 << 30)[first.offset : first.offset + first.length]
    assert raw == state.tensors["theta/W1"].reshape(-1)[: first.length // 2].tobytes()

    restored, _ = load_training(local_store, result.ref, trainer=_trainer(config))
    for name, tag in HALF_TENSORS.items():
        assert dtype_tag(restored.tensors[name].dtype) == tag
        assert np.array_equal(_bits(restored.tensors[name]), _bits(state.tensors[name]))
    assert compare_states(restored, state) == []


def _write_v2(store: LocalStore, state: TrainState, tensors: dict[str, np.ndarray] | None = None) -> CheckpointRef:
    """A blocked checkpoint of ``state`` (``tensors``: its arrays, edited), valid checksums."""
    assert state.config.distributed is not None
    arrays = tensors if tensors is not None else training_tensors(state)
    block_bytes = state.config.distributed.block_bytes
    return write_checkpoint(store, training_content("mixed", state), arrays, block_bytes=block_bytes).ref


def test_a_corrupted_bf16_block_is_refused(local_store: LocalStore) -> None:
    config = dist_config()
    state = _state(config)
    ref = _write_v2(local_store, state)
    manifest = read_manifest(local_store, ref, expect_kind=CheckpointKind.TRAINING)
    block = next(t for t in manifest.tensors if t.name == "theta/W1#00001")
    path = local_store.root / ref.prefix / block.shard
    data = bytearray(path.read_bytes())
    data[block.offset + 1] ^= 0x01  # the exponent's lowest bit of the block's first element
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(E.IntegrityError) as info:
        load_training(local_store, ref, trainer=_trainer(config))
    assert info.value.field == "tensors[theta/W1#00001].checksum"


@pytest.mark.parametrize("layout", sorted(CONFIGS))
@pytest.mark.parametrize(("name", "bad"), [("theta/W1", np.nan), ("adam.m/W1", -np.inf), ("theta/W2", np.inf)])
def test_a_non_finite_half_value_is_refused(local_store: LocalStore, layout: str, name: str, bad: float) -> None:
    config = CONFIGS[layout]()
    state = _state(config)
    arrays = {k: np.array(v, copy=True) for k, v in training_tensors(state).items()}
    arrays[name].reshape(-1)[-1] = bad
    if layout == "blocked":
        ref = _write_v2(local_store, state, arrays)
    else:
        ref = write_checkpoint(local_store, training_content("mixed", state), arrays).ref
    trainer = _trainer(config)
    with pytest.raises(E.NonFiniteError) as info:
        load_training(local_store, ref, trainer=trainer)
    assert info.value.field == f"tensors[{name}]"
    manifest = read_manifest(local_store, ref, expect_kind=CheckpointKind.TRAINING)
    with pytest.raises(E.NonFiniteError):  # streamed verification (ckpt verify) too
        verify_tensors(local_store, ref, manifest, value_check=trainer.check_values, chunk_bytes=16)


def test_check_finite_sees_bfloat16_and_is_not_fooled_by_a_sum_that_overflows() -> None:
    biggest = np.full(1000, ml_dtypes.finfo(BFLOAT16).max, dtype=BFLOAT16)
    check_finite("big", biggest)  # its float32 sum overflows; every value is finite
    check_finite("big", np.full(1000, 65504.0, dtype=np.float16))
    for dtype in (BFLOAT16, np.dtype(np.float16)):
        values = np.ones(1000, dtype=dtype)
        values[500] = np.nan
        with pytest.raises(E.NonFiniteError) as info:
            check_finite("x", values)
        assert info.value.found == "1 non-finite"


@pytest.mark.parametrize(("saved", "declared"), [(F16, BF16), (BF16, F16), (BF16, "<f4"), ("<f8", BF16)])
@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_a_half_tensor_of_the_wrong_dtype_is_refused(
    local_store: LocalStore, layout: str, saved: str, declared: str
) -> None:
    config = CONFIGS[layout]()
    state = _state(config, {"theta/W1": saved} if saved != "<f8" else {})
    ref = save_training(local_store, "mixed", state).ref
    with pytest.raises(E.TensorSpecError) as info:
        load_training(local_store, ref, trainer=_trainer(config, {"theta/W1": declared}))
    assert (info.value.field, info.value.expected, info.value.found) == ("tensors[theta/W1].dtype", declared, saved)


def test_the_built_in_trainer_refuses_a_bf16_tensor_where_it_declares_float64(local_store: LocalStore) -> None:
    ref = save_training(local_store, "mixed", _state(small_config())).ref
    with pytest.raises(E.TensorSpecError) as info:
        load_training(local_store, ref)
    assert info.value.field.endswith(".dtype") and info.value.expected == "<f8"


@pytest.mark.parametrize("tag", ["<V2", "|V2", "bfloat17", "float16", ">f2", "<V1", ""])
@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_a_manifest_with_an_unknown_dtype_tag_is_refused(local_store: LocalStore, layout: str, tag: str) -> None:
    config = CONFIGS[layout]()
    ref = save_training(local_store, "mixed", _state(config)).ref
    victim = "theta/W1#00000" if layout == "blocked" else "theta/W1"

    def edit(body: dict[str, Any]) -> None:
        for t in body["tensors"]:
            if t["name"] == victim:
                t["dtype"] = tag

    if layout == "blocked":  # format v3: the block entries are in the rank index
        rewrite_rank_index(local_store, ref, 0, edit)
        field = f"indexes[0].tensors[{victim}].dtype"
    else:
        rewrite_manifest(local_store, ref, edit)
        field = f"tensors[{victim}].dtype"
    with pytest.raises(E.TensorSpecError) as info:
        load_training(local_store, ref, trainer=_trainer(config))
    assert (info.value.field, info.value.found) == (field, tag)


def test_a_reader_without_bfloat16_refuses_it_naming_the_dtype(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a release before bfloat16 does with such a checkpoint (its allow-list, emulated)."""
    ref = save_training(local_store, "mixed", _state(small_config())).ref
    monkeypatch.setattr(tensors_module, "ALLOWED_DTYPES", ALLOWED_DTYPES - {BF16})
    with pytest.raises(E.TensorSpecError) as info:
        read_manifest(local_store, ref, expect_kind=CheckpointKind.TRAINING)
    assert info.value.field == "tensors[adam.m/W1].dtype" and info.value.found == BF16


def test_a_bf16_tolerance_comparison_counts_bf16_as_floating() -> None:
    config = small_config()
    a = _state(config)
    b = _state(config)
    b.tensors["theta/W1"].reshape(-1).view(np.uint16)[5] += 1  # one bf16 ulp off
    [diff] = compare_states(a, b)
    assert diff.field == "theta.W1" and diff.detail.startswith("1 of ")
    assert compare_states(a, b, atol=0.05) == []
