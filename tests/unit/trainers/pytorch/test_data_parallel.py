"""The PyTorch adapter, data-parallel (``cairn.trainers.pytorch.data_parallel``), in one process: the
one-process engine is ``cairn train``'s arithmetic bit for bit and writes what ``save_training``
writes; every rank's share of the microbatches (dropout, BatchNorm and all) combines into the
same bits for W = 1, 2, 4, 8; the reduction and the block shares do not depend on W; a blocked
checkpoint round-trips through the adapter's validated import; the rank-order switch breaks it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from cairn import errors as E
from cairn.checkpoint import CheckpointRef, list_checkpoints
from cairn.checkpoint.blocks import plan_blocks
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.distributed.comm import SoloComm
from cairn.distributed.reduce import combine, tree_sum
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch.data_parallel import TorchDP, byte_shares, microbatch_seed, reduce_microbatches
from cairn.trainers.pytorch.trainer import TorchOptions, TorchSetup, TorchTrainer
from cairn.training import load_training
from tests.conftest import digits_dp_config


def solo_engine(config: TrainConfig, store: LocalStore, run_id: str = "dp") -> TorchDP:
    return TorchDP(load_trainer(config), SoloComm(), run_id, store, CheckpointOptions())


def fingerprint(store: LocalStore, ref: str | CheckpointRef) -> str:
    ref = CheckpointRef.parse(ref) if isinstance(ref, str) else ref
    return read_manifest(store, ref, expect_kind=None).fingerprint


class StubComm:
    """Rank ``rank`` of ``world`` for code that only asks who it is. In an update it records
    what the rank sends in each reduction's first exchange (its partial sums: gradients, then
    buffers and loss), answers zeros, and stops the update at the second reduction."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.sent: list[np.ndarray] = []
        self.calls = 0

    def exchange(self, send: np.ndarray, send_sizes: Sequence[int], recv_sizes: Sequence[int]) -> np.ndarray:
        self.calls += 1
        if self.calls % 2:
            self.sent.append(send.copy())
        if len(self.sent) == 2:
            raise Sent(self.sent)
        return np.zeros(sum(recv_sizes), dtype=send.dtype)


class Sent(Exception):
    def __init__(self, vectors: list[np.ndarray]) -> None:
        super().__init__("the second reduction reached")
        self.vectors = vectors


class ThreadComm:
    """One of ``world`` in-process ranks (threads) whose ``exchange`` is a real all-to-all."""

    def __init__(self, rank: int, world: int, slots: list[Any], barrier: threading.Barrier) -> None:
        self.rank, self.world, self.slots, self.barrier = rank, world, slots, barrier

    def exchange(self, send: np.ndarray, send_sizes: Sequence[int], recv_sizes: Sequence[int]) -> np.ndarray:
        offsets = np.cumsum([0, *send_sizes])
        self.slots[self.rank] = [send[offsets[j] : offsets[j + 1]].copy() for j in range(self.world)]
        self.barrier.wait()
        out = np.concatenate([self.slots[r][self.rank] for r in range(self.world)])
        assert out.size == sum(recv_sizes)
        self.barrier.wait()
        return out


def reduce_in_threads(vectors: list[np.ndarray], world: int) -> list[np.ndarray]:
    """``reduce_microbatches`` run by ``world`` thread ranks, each over its block of ``vectors``."""
    per = len(vectors) // world
    slots: list[Any] = [None] * world
    barrier = threading.Barrier(world, timeout=30)
    out: list[Any] = [None] * world

    def rank(r: int) -> None:
        comm = ThreadComm(r, world, slots, barrier)
        out[r] = reduce_microbatches(comm, tree_sum(vectors[r * per : (r + 1) * per]), len(vectors))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_reduction_gives_the_same_bits_for_every_world_size_signed_zeros_included() -> None:
    rng = np.random.default_rng(7)
    vectors = [rng.standard_normal(1001) * 10.0 ** rng.integers(-8, 8, 1001) for _ in range(8)]
    for v in vectors:
        v[:3] = -0.0  # all-negative zeros: the tree's cut decides the sign unless normalised
        v[3] = 0.0
    reference = tree_sum(vectors) * (1.0 / 8)
    for world in (1, 2, 4, 8):
        for result in reduce_in_threads(vectors, world):
            assert result.tobytes() == (reference + 0.0).tobytes(), world
            assert not np.signbit(result[:4]).any()


def test_rank_order_switch_makes_the_reduction_depend_on_world_size(rank_order_sums: Callable[[], None]) -> None:
    rng = np.random.default_rng(8)
    vectors = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8, 1000) for _ in range(8)]
    rank_order_sums()
    w1, w4 = reduce_in_threads(vectors, 1)[0], reduce_in_threads(vectors, 4)[0]
    assert w1.tobytes() != w4.tobytes()  # a left fold per rank, then across ranks: W shows


@pytest.mark.parametrize("sizes", [[8] * 37, [1024, 8, 8, 4, 2048, 64, 5056, 8], [3], [0, 0, 5], []])
def test_byte_shares_tile_the_blocks_contiguously_and_balanced(sizes: list[int]) -> None:
    total = sum(sizes)
    for world in range(1, 9):
        shares = byte_shares(sizes, world)
        assert len(shares) == world
        assert [k for s in shares for k in s] == list(range(len(sizes)))
        for share in shares:
            assert sum(sizes[k] for k in share) <= total / world + max(sizes, default=0)


def test_every_rank_writes_its_own_blocks_and_together_exactly_the_checkpoint(tmp_path: Path) -> None:
    engine = solo_engine(digits_dp_config(), LocalStore(tmp_path))
    engine.start_fresh()
    engine.step()
    everything = [b.name for b in plan_blocks(engine.parts())]
    assert len(everything) > 16
    for world in (1, 2, 4, 8):
        written: list[str] = []
        for rank in range(world):
            engine.comm = StubComm(rank, world)
            written += list(engine.my_blocks())
        assert written == everything, world  # disjoint, contiguous, in order, complete


def test_solo_engine_is_cairn_train_bit_for_bit(tmp_path: Path) -> None:
    """TorchDP at W=1 (the gang's arithmetic) and ``TrainingSession`` (``TorchTrainer.train`` +
    ``save_training``) with the same config commit identical checkpoints, an epoch-end
    evaluation included."""
    config = digits_dp_config()
    engine = solo_engine(config, LocalStore(tmp_path / "dp"))
    engine.start_fresh()
    dp = {0: engine.save().fingerprint}
    for _ in range(6):
        engine.step()
        if engine.state is not None and engine.state.step % 3 == 0:
            dp[engine.state.step] = engine.save().fingerprint
    session = TrainingSession.fresh("dp", tmp_path / "session", config)
    session.checkpoint()
    session.run(6, checkpoint_every=3)
    store = LocalStore(tmp_path / "session")
    plain = {s: fingerprint(store, CheckpointRef(store.url, "dp", CheckpointKind.TRAINING, s)) for s in (0, 3, 6)}
    assert dp == plain
    assert engine.state is not None and len(engine.state.history["val_loss"]) == 1


def test_microbatch_shares_of_any_world_size_combine_to_the_same_bits(tmp_path: Path) -> None:
    """Rank r of W computes only its block of microbatches (dropout masks and BatchNorm
    statistics included); the W partial sums combine into the bits of W=1's tree over all M."""
    engine = solo_engine(digits_dp_config(), LocalStore(tmp_path))
    engine.start_fresh()
    engine.step()
    engine.step()
    assert engine.state is not None
    start = engine.state.copy()

    def partials(rank: int, world: int) -> list[np.ndarray]:
        engine._adopt(start)
        engine.comm = StubComm(rank, world)
        with pytest.raises(Sent) as sent:
            engine.step()
        return sent.value.vectors

    whole = partials(0, 1)
    assert [v.dtype for v in whole] == [np.float32, np.float64]  # gradients as the model's dtype
    for world in (2, 4, 8):
        by_rank = [partials(r, world) for r in range(world)]
        for k, one in enumerate(whole):
            combined = combine([p[k] for p in by_rank])
            zero = one.dtype.type(0)
            assert (combined + zero).tobytes() == (one + zero).tobytes(), (world, k)  # (zeros: see reduction)
    engine._adopt(start)
    assert engine.state is not None and engine.state.step == 2  # the aborted updates left no trace


class TinyOptions(TorchOptions):
    dropout: float = 0.0


class TinyBN(TorchTrainer):
    """Linear-BatchNorm-ReLU-(Dropout)-Linear with plain SGD: an update is ``p - lr * grad``."""

    Options = TinyOptions
    options: TinyOptions

    def build(self) -> TorchSetup:
        g = torch.Generator().manual_seed(5)
        x, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)
        model = nn.Sequential(
            nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(self.options.dropout), nn.Linear(6, 3)
        )
        return TorchSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.25), train=(x, y))


def tiny_config(**options: Any) -> TrainConfig:
    return parse_config(
        {
            "seed": 11,
            "batch_size": 16,
            "trainer": {"factory": f"{__name__}:TinyBN", "options": options},
            "distributed": {"microbatches": 4, "block_bytes": 64},
        }
    )


def test_update_is_the_mean_of_microbatch_gradients_and_buffers(tmp_path: Path) -> None:
    """Each microbatch starts from the update's buffers; the gradient is the tree mean of the
    microbatch gradients; the running statistics are the tree mean of the microbatches' and
    ``num_batches_tracked`` advances once per update."""
    engine = solo_engine(tiny_config(), LocalStore(tmp_path))
    engine.start_fresh()
    engine.step()
    trainer = engine.trainer
    assert isinstance(trainer, TinyBN) and engine.state is not None
    before = engine.state.copy()
    idx = trainer.sampler.batch(1)
    x, y = trainer.splits["train"].batch(idx)
    grads: list[dict[str, np.ndarray]] = []
    running: list[np.ndarray] = []
    for i in range(4):
        twin = TinyBN(trainer.config, trainer.options)
        with torch.no_grad():
            for name, p in twin.model.named_parameters():
                p.copy_(torch.from_numpy(before.tensors[f"param/{name}"]))
            for name, b in twin.model.named_buffers():
                b.copy_(torch.from_numpy(before.tensors[f"buffer/{name}"]))
        twin.model.train()
        loss = nn.functional.cross_entropy(twin.model(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4])
        loss.backward()  # type: ignore[no-untyped-call]
        grads.append({n: p.grad.numpy().copy() for n, p in twin.model.named_parameters()})  # type: ignore[union-attr]
        running.append(twin.model[1].running_mean.numpy().astype(np.float64))
    engine.step()
    after = engine.state.tensors
    for name in grads[0]:
        mean = tree_sum([g[name] for g in grads]) * np.float32(0.25) + np.float32(0)
        want = torch.from_numpy(before.tensors[f"param/{name}"].copy()).add_(torch.from_numpy(mean), alpha=-0.25)
        assert after[f"param/{name}"].tobytes() == want.numpy().tobytes(), name
    assert after["buffer/1.running_mean"].tobytes() == (tree_sum(running) * 0.25).astype(np.float32).tobytes()
    assert int(after["buffer/1.num_batches_tracked"]) == 2


def test_dropout_draws_per_microbatch_and_leaves_the_run_streams_alone(tmp_path: Path) -> None:
    """With dropout, the masks come from (seed, step, microbatch): two runs agree bit for bit,
    and the run's own generators (checkpointed) do not move, since SGD draws nothing."""
    states = []
    for run in ("a", "b"):
        engine = solo_engine(tiny_config(dropout=0.5), LocalStore(tmp_path / run))
        engine.start_fresh()
        assert engine.state is not None
        rng0 = engine.state.tensors["rng/torch"].copy()
        for _ in range(3):
            engine.step()
        assert engine.state.tensors["rng/torch"].tobytes() == rng0.tobytes()
        states.append(engine.save().fingerprint)
    assert states[0] == states[1]
    seeds = {microbatch_seed(11, s, i).tobytes() for s in range(3) for i in range(4)}
    assert len(seeds) == 12


def test_tree_switch_reaches_the_torch_update(tmp_path: Path, rank_order_sums: Callable[[], None]) -> None:
    def run(store: str) -> str:
        engine = solo_engine(digits_dp_config(), LocalStore(tmp_path / store))
        engine.start_fresh()
        engine.step()
        return engine.save().fingerprint

    tree = run("tree")
    rank_order_sums()
    assert run("fold") != tree  # at W=1 a left fold over 8 microbatches is another sum


def test_blocked_checkpoint_round_trips_through_the_adapters_import(tmp_path: Path) -> None:
    config = digits_dp_config()
    store = LocalStore(tmp_path)
    engine = solo_engine(config, store)
    engine.start_fresh()
    for _ in range(3):
        engine.step()
    saved = engine.save()
    assert engine.state is not None
    held = engine.state.copy()
    restored = solo_engine(config, store)
    manifest: Manifest = restored.load(CheckpointRef.parse(saved.ref))
    assert manifest.parts is not None and manifest.format_version == 3
    assert restored.state is not None and restored.state.step == 3
    assert restored.state.meta == held.meta and restored.state.rng_state == held.rng_state
    assert restored.state.history == held.history
    for name, arr in held.tensors.items():
        assert restored.state.tensors[name].tobytes() == arr.tobytes(), name
    generic, _ = load_training(store, CheckpointRef.parse(saved.ref))  # the one-process reader agrees
    assert sorted(generic.tensors) == sorted(held.tensors)
    for _ in range(2):
        engine.step()
        restored.step()
    assert restored.save().fingerprint == engine.save().fingerprint


def test_restore_refuses_a_corrupt_block_and_keeps_nothing(tmp_path: Path) -> None:
    config = digits_dp_config()
    store = LocalStore(tmp_path)
    engine = solo_engine(config, store)
    engine.start_fresh()
    engine.step()
    saved = engine.save()
    ref = CheckpointRef.parse(saved.ref)
    shard = tmp_path / ref.prefix / read_manifest(store, ref, expect_kind=None).shards[0].key
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    fresh = solo_engine(config, store)
    with pytest.raises(E.CheckpointError):
        fresh.load(ref)
    assert fresh.state is None


def test_a_non_finite_state_is_a_diverged_run_and_is_not_committed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    engine = solo_engine(digits_dp_config(), store)
    engine.start_fresh()
    engine.step()
    assert engine.state is not None
    engine.state.tensors["param/head.1.weight"][0, 0] = np.nan  # (a view of the live parameter)
    with pytest.raises(E.TrainingDivergedError, match="step 1"):
        engine.save()
    assert list_checkpoints(store, "dp") == []


def test_engine_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(E.ConfigError, match="microbatches"):
        TorchDP(load_trainer(digits_dp_config()), StubComm(0, 3), "dp", LocalStore(tmp_path), CheckpointOptions())  # type: ignore[arg-type]
    plain = load_trainer(parse_config({"trainer": {"factory": f"{__name__}:TinyBN"}}))
    with pytest.raises(E.ConfigError, match="distributed"):
        TorchDP(plain, SoloComm(), "dp", LocalStore(tmp_path), CheckpointOptions())
