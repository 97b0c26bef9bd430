"""Format v3: per-rank index objects under a root manifest that grows with ranks, not blocks.

A W=4 save read back at W=2 reads only the indexes covering each new rank's slice (the store's
reads counted) and the same bits; the fingerprint is the same however many ranks wrote the
state; a corrupted, missing, edited or misplaced rank index is refused with the field named;
a root whose covers overlap or leave a gap is refused before any index is read; the root's size
does not grow with the number of blocks; the bounds come from what the trainer declares."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, read_manifest, read_tensors, write_checkpoint
from cairn.checkpoint.blocks import Block, parts_of, plan_blocks, split_blocks
from cairn.checkpoint.commit import commit_indexed
from cairn.checkpoint.index import expand, write_rank_index
from cairn.checkpoint.layout import manifest_key
from cairn.checkpoint.manifest import INDEXED_FORMAT_VERSION, PartSpec
from cairn.checkpoint.options import CEILING_ENV, CheckpointOptions, Limits
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import new_save_nonce, write_shards
from cairn.checkpoint.tensors import ALLOWED_DTYPES, TensorSpec, dtype_from_tag
from cairn.checkpoint.validate import WIDEST_ITEMSIZE
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.validate import run_bounds
from cairn.training.manager import load_training, save_training
from tests.conftest import rewrite_manifest, rewrite_rank_index, small_config
from tests.doubles.sparse import SparseStore, zero_rank

pytestmark = pytest.mark.usefixtures("no_signing_key")
INFERENCE = CheckpointKind.INFERENCE
UNSIGNED = CheckpointOptions()
BLOCK = 64  # bytes per block: 8 float64, 16 float32


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "emb": rng.standard_normal((12, 10)),  # 120 values: 15 blocks
        "w": rng.standard_normal(37).astype(np.float32),  # 3 blocks
        "b": np.arange(5, dtype=np.int64),
        "empty": np.zeros(0),
    }


def _content(run: str, step: int = 1) -> CheckpointContent:
    return CheckpointContent(kind=INFERENCE, run_id=run, step=step, meta={"note": "v3"})


def _shares(blocks: list[Block], world: int) -> list[list[Block]]:
    """Contiguous shares of the plan order (any split will do: the format does not care)."""
    cuts = [round(k * len(blocks) / world) for k in range(world + 1)]
    return [blocks[cuts[r] : cuts[r + 1]] for r in range(world)]


def _save_at(store: SparseStore | Any, run: str, world: int, arrays: dict[str, np.ndarray]) -> CheckpointRef:
    """What ``coordinated_save`` does, rank by rank in one process: shards, an index each, one root."""
    content = _content(run)
    parts = parts_of(arrays, BLOCK)
    views = split_blocks(arrays, parts)
    nonce = new_save_nonce()
    refs = []
    for rank, share in enumerate(_shares(plan_blocks(parts), world)):
        mine = {b.name: views[b.name] for b in share}
        shards = write_shards(store, content, mine, nonce=nonce, rank=rank, options=UNSIGNED)
        refs.append(write_rank_index(store, content, shards, nonce=nonce))
    return commit_indexed(store, content, refs, nonce=nonce, parts=parts, options=UNSIGNED).ref


def test_a_w4_save_read_at_w2_reads_only_the_indexes_it_needs() -> None:
    arrays = _arrays()
    real = _RealBytes()
    ref = _save_at(real, "w4", 4, arrays)
    root = read_manifest(real, ref, expect_kind=INFERENCE, options=UNSIGNED, expand_index=False)
    assert root.format_version == INDEXED_FORMAT_VERSION and len(root.indexes or []) == 4
    assert root.tensors == [] and root.shards == []
    assert real.index_reads() == 0  # the root alone was read and checked
    parts = root.parts or {}
    restored = {name: np.empty(spec.shape, dtype=dtype_from_tag(str(spec.dtype))) for name, spec in parts.items()}
    targets = split_blocks(restored, parts)
    for rank, share in enumerate(_shares(plan_blocks(parts), 2)):
        before = dict(real.reads)
        mine = {b.name for b in share}
        sub = expand(real, ref, root, mine)
        read_index_keys = {k for k, n in real.reads.items() if k.endswith(".index.json") and n > before.get(k, 0)}
        covering = {f"{ref.prefix}/{r.key}" for r in root.indexes or [] if r.rank in (2 * rank, 2 * rank + 1)}
        assert read_index_keys == covering  # 2 of the 4 indexes, the ones holding this slice
        read_tensors(real, ref, sub, only=mine, out={n: targets[n] for n in mine})
    for name, values in arrays.items():
        assert np.array_equal(restored[name], values) and restored[name].dtype == values.dtype


class _RealBytes(SparseStore):
    """A SparseStore that keeps every object whole (real shard bytes), still counting reads."""

    def write_object(self, key: str, chunks: Any, size: int | None = None) -> None:
        data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
        super(SparseStore, self).write_object(key, [data])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_the_fingerprint_does_not_depend_on_the_number_of_ranks(world: int) -> None:
    arrays = _arrays()
    single = write_checkpoint(_RealBytes("one"), _content("fp"), arrays, block_bytes=BLOCK, options=UNSIGNED)
    store = _RealBytes(f"w{world}")
    ref = _save_at(store, "fp", world, arrays)
    manifest = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED)
    assert manifest.fingerprint == single.manifest.fingerprint
    assert manifest.writer.ranks == world and len(manifest.tensors) == 15 + 3 + 1 + 1


def _v3(world: int = 2) -> tuple[_RealBytes, CheckpointRef]:
    store = _RealBytes("tamper")
    return store, _save_at(store, "tamper", world, _arrays())


def _refused(store: Any, ref: CheckpointRef, error: type[Exception], field: str) -> Exception:
    with pytest.raises(error) as info:
        read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED)
    assert field in str(getattr(info.value, "field", "")), info.value
    return info.value


def test_a_corrupted_rank_index_is_refused_by_the_checksum_in_the_root() -> None:
    store, ref = _v3()
    root = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, expand_index=False)
    key = f"{ref.prefix}/{(root.indexes or [])[1].key}"
    raw = bytearray(store.read(key, 1 << 30))
    raw[len(raw) // 2] ^= 0x20
    store.corrupt(key, bytes(raw))
    _refused(store, ref, E.IntegrityError, "indexes[1].checksum")


def test_a_missing_rank_index_is_refused() -> None:
    store, ref = _v3()
    root = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, expand_index=False)
    store.delete([f"{ref.prefix}/{(root.indexes or [])[0].key}"])
    _refused(store, ref, E.IntegrityError, "indexes[0]")


def _edit_first_entry(change: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["tensors"][0].update(change)


@pytest.mark.parametrize(
    ("edit", "redigest", "error", "field"),
    [
        (_edit_first_entry({"checksum": "blake3:" + "0" * 64}), False, E.IntegrityError, "indexes[0].digest"),
        (_edit_first_entry({"name": "emb#00014"}), True, E.TensorSpecError, "indexes[0].tensors[emb#00014]"),
        (_edit_first_entry({"dtype": "<f4"}), True, E.TensorSpecError, ".dtype"),
        (_edit_first_entry({"offset": 1 << 40}), True, E.TensorSpecError, ".offset"),
        (lambda b: b.update(rank=1), True, E.IntegrityError, "indexes[0].rank"),
        (lambda b: b.update(step=2), True, E.IntegrityError, "indexes[0].step"),
        (lambda b: b["tensors"].pop(), True, E.TensorSpecError, "indexes[0].tensors"),
        (lambda b: b["shards"][0].update(key="elsewhere/rank000-0000.bin"), True, E.ManifestError, "indexes[0].shards"),
    ],
)
def test_an_edited_rank_index_is_refused_with_the_field_named(
    edit: Callable[[dict[str, Any]], None], redigest: bool, error: type[Exception], field: str
) -> None:
    store, ref = _v3()
    rewrite_rank_index(store, ref, 0, edit, redigest=redigest)  # the root's checksum agrees with it
    _refused(store, ref, error, field)


@pytest.mark.parametrize(
    ("edit", "error", "field"),
    [  # every root below is re-fingerprinted: the structural check is the one that fires
        (lambda m: m["indexes"][1]["covers"].append(["emb", 0, 1]), E.TensorSpecError, "indexes[1].entries"),
        (lambda m: m["indexes"][0]["covers"].pop(0), E.TensorSpecError, "indexes[0].entries"),
        (lambda m: m["indexes"][0]["covers"][0].__setitem__(2, 99), E.TensorSpecError, "indexes[0].covers"),
        (lambda m: m["indexes"][0].update(key="elsewhere/rank000.index.json"), E.ManifestError, "indexes[0].key"),
        (lambda m: m["indexes"].append(dict(m["indexes"][0])), E.ManifestError, "indexes"),
        (lambda m: m["indexes"].pop(), E.TensorSpecError, "parts"),
        (lambda m: m["parts"]["emb"].update(dtype="<V8"), E.TensorSpecError, "parts[emb].dtype"),
        (lambda m: m["parts"]["emb"].update(dtype=None), E.ManifestError, ""),
        (lambda m: m.update(tensors=[{"name": "x"}]), E.ManifestError, ""),
    ],
)
def test_a_tampered_root_is_refused_before_any_index_is_read(
    edit: Callable[[dict[str, Any]], None], error: type[Exception], field: str
) -> None:
    store, ref = _v3()
    rewrite_manifest(store, ref, edit)
    before = store.index_reads()
    _refused(store, ref, error, field)
    assert store.index_reads() == before


def test_the_root_grows_with_ranks_not_with_blocks() -> None:
    sizes = {}
    for elems in (1_000, 100_000):
        store = _RealBytes(f"grow{elems}")
        ref = _save_at(store, "grow", 4, {"x": np.zeros(elems), "y": np.ones(3)})
        sizes[elems] = len(store.read(manifest_key(ref.run_id, ref.kind, ref.step), 1 << 30))
        manifest = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED)
        assert len(manifest.tensors) == -(-elems // 8) + 1
    assert abs(sizes[100_000] - sizes[1_000]) < 200  # 12,500 blocks vs 125: a few digits more


def _declared(step: int, specs: dict[str, TensorSpec], parts: dict[str, PartSpec]) -> Any:
    """A stand-in trainer that declares ``specs`` and a config with no ``distributed`` section
    (all ``run_bounds`` asks of one)."""

    class Declares:
        eval_history = False
        config = small_config()

        def tensor_specs(self, step: int, meta: dict[str, Any]) -> dict[str, TensorSpec]:
            return specs

        def check_state(self, *args: object) -> None:
            return None

    del step, parts
    return Declares()


def _two_tb(store: SparseStore, world: int = 16) -> tuple[CheckpointRef, dict[str, PartSpec]]:
    """A 4 TiB checkpoint of zeros (bytes declared, not stored) over ``world`` ranks: 2,048
    float64 tensors of 2 GiB, each cut into two 1 GiB blocks."""
    shapes = {f"layer{i}/w": [8192, 8192 * 4] for i in range(2048)}
    parts = {n: PartSpec(shape=s, block_elems=(1 << 30) // 8, dtype="<f8") for n, s in shapes.items()}
    content = _content("big")
    nonce = new_save_nonce()
    blocks = plan_blocks(parts)
    refs = [
        zero_rank(store, content, parts, share, nonce=nonce, rank=r, shard_bytes=1 << 34)
        for r, share in enumerate(_shares(blocks, world))
    ]
    return commit_indexed(store, content, refs, nonce=nonce, parts=parts, options=UNSIGNED).ref, parts


def test_a_checkpoint_past_the_old_caps_is_read_when_the_trainer_declares_it() -> None:
    store = SparseStore("big")
    ref, parts = _two_tb(store)
    specs = {n: TensorSpec("<f8", tuple(p.shape)) for n, p in parts.items()}
    root = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, expand_index=False)
    assert root.total_bytes == 2048 * 8192 * 32768 * 8 > 64 << 30  # 4 TiB: 64x the old 64 GiB cap
    # an inference checkpoint of no config: the stand-in trainer declares only sizes (checked: no identity to compare)
    sized = lambda m: run_bounds(_declared(m.step, specs, parts), m, Limits(), checked=True)  # noqa: E731
    manifest = read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, bounds=sized)
    assert len(manifest.tensors) == 2048 * 2 and manifest.total_bytes == root.total_bytes
    smaller = {**specs, "layer0/w": TensorSpec("<f8", (8192, 1))}  # the trainer declares less than claimed
    less = lambda m: run_bounds(_declared(m.step, smaller, parts), m, Limits(), checked=True)  # noqa: E731
    before = store.index_reads()
    with pytest.raises(E.SizeLimitError) as info:
        read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, bounds=less)
    assert info.value.field == "total_bytes" and "trainer declares" in str(info.value)
    assert store.index_reads() == before  # refused from the root, before any index was read


def test_a_claim_of_ten_to_the_fifteen_bytes_is_refused_by_the_ceiling() -> None:
    store = SparseStore("huge")
    ref, _ = _two_tb(store, world=2)
    tiny_ceiling = CheckpointOptions(limits=Limits(max_total_bytes=1 << 40))
    with pytest.raises(E.SizeLimitError):
        read_manifest(store, ref, expect_kind=INFERENCE, options=tiny_ceiling, expand_index=False)

    def claim(m: dict[str, Any]) -> None:
        m["parts"]["layer0/w"]["shape"] = [10**15 // 8 // 32768 + 1, 32768]

    rewrite_manifest(store, ref, claim)
    assert Limits().max_total_bytes < 10**15
    with pytest.raises(E.SizeLimitError) as info:
        read_manifest(store, ref, expect_kind=INFERENCE, options=UNSIGNED, expand_index=False)
    assert info.value.field == "parts[layer0/w].shape" and info.value.found > 10**15


def test_widest_itemsize_is_the_widest_allowed_dtype() -> None:
    assert max(dtype_from_tag(t).itemsize for t in ALLOWED_DTYPES) == WIDEST_ITEMSIZE


def test_a_losing_attempt_deletes_only_its_own_objects() -> None:
    store, ref = _v3(world=3)
    before = {o.key for o in store.list(ref.prefix)}
    again = _save_at(store, "tamper", 3, _arrays())  # a retry of the same state: converges
    assert again == ref
    assert {o.key for o in store.list(ref.prefix)} == before  # its shards and indexes are gone, ours kept
    body = json.loads(store.read(manifest_key(ref.run_id, ref.kind, ref.step), 1 << 30))
    assert body["format_version"] == 3 and body["tensors"] == []


def test_the_ceiling_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CEILING_ENV, "256TiB")
    assert CheckpointOptions.from_env().limits.max_total_bytes == 256 << 40
    monkeypatch.setenv(CEILING_ENV, "1048576")
    assert Limits.from_env().max_total_bytes == 1 << 20
    for bad in ("lots", "-3", "0", "12 furlongs"):
        monkeypatch.setenv(CEILING_ENV, bad)
        with pytest.raises(E.ConfigError) as info:
            Limits.from_env()
        assert info.value.field == CEILING_ENV and info.value.found == bad
    monkeypatch.delenv(CEILING_ENV)
    assert Limits.from_env() == Limits()


def test_one_rank_writes_more_blocks_than_the_tensor_ceiling_with_six_digit_block_names() -> None:
    """Block entries count against the blocks ceiling, not the tensors one, and a tensor of more
    than 99,999 blocks is named NAME#100000 onward (the writer's ``{:05d}``) and reads back."""
    assert Limits().max_tensors < 100_001
    arrays = {"w": np.arange(100_001, dtype=np.float64)}
    store = _RealBytes("many")
    result = write_checkpoint(store, _content("many"), arrays, block_bytes=8, options=UNSIGNED)
    manifest = read_manifest(store, result.ref, expect_kind=INFERENCE, options=UNSIGNED)
    assert len(manifest.tensors) == 100_001 and "w#100000" in {t.name for t in manifest.tensors}
    back = read_tensors(store, result.ref, manifest)
    assert np.array_equal(np.concatenate([back[f"w#{i:05d}"] for i in range(100_001)]), arrays["w"])


def test_a_rank_index_padded_with_shards_is_refused_from_its_counts() -> None:
    store, ref = _v3()
    rewrite_rank_index(store, ref, 0, lambda b: b["shards"].extend([{}] * 50_000))
    _refused(store, ref, E.SizeLimitError, "indexes[0].bytes")  # too big for its entries, before reading it
    store, ref = _v3()
    rewrite_rank_index(store, ref, 0, lambda b: b["shards"].extend([{}] * 20))
    _refused(store, ref, E.TensorSpecError, "indexes[0].tensors")  # counted before the schema is built


def test_blocks_smaller_than_the_runs_are_refused_from_the_root(tmp_path: Path) -> None:
    """The bound on a checkpoint's blocks comes from the run (its specs at the run's block size),
    not from the manifest's own block sizes: the same state cut into 64-byte blocks lists far more
    block entries (each costs memory to hold) and is refused by the root's counts, before a rank
    index is read. Read at the block size it was written with, it loads."""
    session = TrainingSession.fresh("fine", LocalStore(tmp_path / "s"), small_config())
    session.run(5)
    store = CountingReads(tmp_path / "tiny")
    tiny = CheckpointOptions(incremental=True, block_bytes=64)
    ref = save_training(store, "fine", session.state, options=tiny).ref
    store.indexes = 0
    with pytest.raises(E.SizeLimitError, match="blocks") as info:
        load_training(store, ref, options=CheckpointOptions(), trainer=session.trainer)
    assert "1048576-byte blocks" in str(info.value) and store.indexes == 0
    state, _ = load_training(store, ref, options=tiny, trainer=session.trainer)
    assert state.step == 5


class CountingReads(LocalStore):
    """Counts the rank indexes read."""

    indexes = 0

    def read(self, key: str, max_bytes: int) -> bytes:
        self.indexes += key.endswith(".index.json")
        return super().read(key, max_bytes)
