"""Shared fixtures: small configs, stores, and ways to build broken checkpoints."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from blake3 import blake3

from cairn import errors as E
from cairn.checkpoint import CheckpointRef, write_checkpoint
from cairn.checkpoint.blocks import parts_json, parts_of, split_blocks
from cairn.checkpoint.commit import commit_manifest
from cairn.checkpoint.content import CheckpointContent, index_of
from cairn.checkpoint.index import index_summary, summary_of
from cairn.checkpoint.manifest import CheckpointKind, HistoryRef, IndexRef, Manifest
from cairn.checkpoint.shards import new_save_nonce, write_shards
from cairn.checkpoint.training import training_content, training_tensors
from cairn.config import TrainConfig, parse_config
from cairn.distributed.reduce import summing_in
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Store

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
"""Inputs recorded by earlier code: a format-v1 checkpoint, workflow histories."""
TOOL_CACHES = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"})
"""Folders tools own (the VCS, the venv, caches): everything else in the checkout is the user's."""


def checkout_files(root: Path = REPO) -> set[str]:
    """Every file and folder in the checkout outside the tools' own folders."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in TOOL_CACHES and not d.endswith(".egg-info")]
        rel = Path(dirpath).relative_to(root)
        found.update(str(rel / name) for name in dirnames + filenames)
    return found


@pytest.fixture(scope="session", autouse=True)
def checkout_stays_untouched() -> Iterator[None]:
    """Tests never write into the user's checkout: temporary directories and buckets only.
    (A run of the suite that leaves, e.g., ``.cairn/store`` behind fails here.)"""
    before = checkout_files()
    yield
    new = sorted(checkout_files() - before)
    assert not new, f"the test session wrote into the checkout: {new[:10]}"


@functools.cache
def _template_manifest(run_id: str, kind: CheckpointKind) -> Manifest:
    store = MemoryStore("template")
    return write_checkpoint(store, CheckpointContent(kind=kind, run_id=run_id, step=0), {"w": np.ones(2)}).manifest


def stamped_manifest(run_id: str, kind: CheckpointKind, step: int) -> bytes:
    """The bytes of a genuine manifest of ``(run_id, kind, step)`` (one two-element tensor; its
    shard is not written), fast enough to lay out thousands of committed checkpoints: listing,
    ``latest`` and retention judge the manifest alone."""
    m = _template_manifest(run_id, kind).model_copy(update={"step": step, "cursor": step})
    fingerprint = CheckpointContent.of(m).fingerprint(index_of(m.tensors), parts_json(m.parts), None)
    return m.model_copy(update={"fingerprint": fingerprint}).to_json_bytes()


def small_config(**overrides: Any) -> TrainConfig:
    base = json.loads((REPO / "examples" / "config.json").read_text())
    base.update(overrides)
    return TrainConfig.model_validate(base)


def epoch_config(**data: object) -> TrainConfig:
    """The small config by epochs, with validation and test splits held out."""
    base = small_config().model_dump(mode="json")
    base["data"].update({"sampling": "epoch", "val_fraction": 0.2, "test_fraction": 0.1, **data})
    return parse_config(base)


def write_v2(store: Store, run_id: str, state: TrainState) -> CheckpointRef:
    """``state`` committed in format v2 (every block listed in the manifest), as releases before
    format v3 wrote a distributed config's checkpoints: for the tests that older formats read."""
    assert state.config.distributed is not None
    content = training_content(run_id, state)
    tensors = training_tensors(state)
    parts = parts_of(tensors, state.config.distributed.block_bytes, indexed=False)
    nonce = new_save_nonce()
    rank0 = write_shards(store, content, split_blocks(tensors, parts), nonce=nonce)
    return commit_manifest(store, content, [rank0], nonce=nonce, parts=parts).ref


def dist_config(microbatches: int = 8, block_bytes: int = 64, **overrides: object) -> TrainConfig:
    """The small config, distributed: batches of 16 in ``microbatches`` microbatches."""
    body = small_config().model_dump(mode="json")
    body.update(batch_size=16, distributed={"microbatches": microbatches, "block_bytes": block_bytes})
    body.update(overrides)
    return TrainConfig.model_validate(body)


def digits_config(**options: Any) -> TrainConfig:
    """The digits example (a PyTorch CNN), small: 4 channels, 16 hidden units."""
    body = json.loads((REPO / "examples" / "digits.json").read_text())
    body["trainer"]["options"].update({"channels": 4, "hidden": 16, **options})
    return parse_config(body)


DP_MICROBATCHES = 8
DP_BLOCK_BYTES = 256


def digits_dp_config(microbatches: int = DP_MICROBATCHES, **options: Any) -> TrainConfig:
    """The digits example, small: 4 channels, 16 hidden units, a 10% train split (5 updates
    per epoch, so an evaluation comes early), batches of 32 in ``microbatches`` microbatches."""
    body = json.loads((REPO / "examples" / "digits.json").read_text())
    body["trainer"]["options"].update(
        {"channels": 4, "hidden": 16, "val_fraction": 0.45, "test_fraction": 0.45, **options}
    )
    body["distributed"] = {"microbatches": microbatches, "block_bytes": DP_BLOCK_BYTES}
    return parse_config(body)


def seed_fixture(config: TrainConfig, tmp_path: Path) -> tuple[TrainingSession, TrainingSession]:
    """The seed scenario on ``config``: 40 updates straight, and 17 + checkpoint + restore (a new
    session, a new trainer) + 23."""
    straight = TrainingSession.fresh("ref", tmp_path / "ref", config)
    straight.run(40, checkpoint_at_end=False)
    at17 = TrainingSession.fresh("run", tmp_path / "run", config).run(17)
    assert at17 is not None
    resumed = TrainingSession.from_checkpoint(at17.ref, config=config)
    resumed.run(23)
    return straight, resumed


HF_MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32},
    "llama": {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
    },
}
"""Tiny Hugging Face architectures built from configs (nothing downloads)."""


def hf_config(arch: str = "gpt2", seed: int = 17, **options: Any) -> TrainConfig:
    """``cairn.trainers.hf:HFCausalLM`` on a tiny ``arch`` of ``HF_MODELS`` and a few KB of text."""
    body = {
        "model": HF_MODELS[arch],
        "vocab_size": 300,
        "context": 16,
        "corpus_bytes": 6000,
        "eval_every": 10,
        "eval_batch_size": 64,
        **options,
    }
    trainer = {"factory": "cairn.trainers.hf:HFCausalLM", "options": body}
    return parse_config({"seed": seed, "batch_size": 8, "trainer": trainer})


@pytest.fixture
def config() -> TrainConfig:
    return small_config()


@pytest.fixture
def local_store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def memory_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def no_signing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """No signing key from the environment the suite runs in: a test signs only with a key it sets."""
    monkeypatch.delenv("CAIRN_SIGNING_KEY", raising=False)
    monkeypatch.delenv("CAIRN_SIGNING_KEY_FILE", raising=False)


def write_broken(
    store: Store,
    run_id: str,
    state: TrainState,
    *,
    tensors: Callable[[dict[str, np.ndarray]], None] | None = None,
    **content_changes: Any,
) -> CheckpointRef:
    """Write a well-formed checkpoint (valid checksums, fingerprint) whose *content* is bad."""
    arrays = {k: np.array(v, copy=True) for k, v in training_tensors(state).items()}
    if tensors is not None:
        tensors(arrays)
    content = training_content(run_id, state)
    for key, value in content_changes.items():
        setattr(content, key, value)
    return write_checkpoint(store, content, arrays).ref


def rewrite_manifest(
    store: Store, ref: CheckpointRef, mutate: Callable[[dict[str, Any]], None], *, refingerprint: bool = True
) -> None:
    """Edit a committed manifest in place; by default keep its fingerprint consistent so the
    check under test (not the fingerprint check) is the one that fires."""
    key = f"{ref.prefix}/manifest.json"
    body = json.loads(store.read(key, 1 << 30))
    mutate(body)
    if refingerprint:
        from cairn.state import Lineage

        try:
            lineage = Lineage.model_validate(body["lineage"]) if body.get("lineage") else None
            content = CheckpointContent(
                kind=CheckpointKind(body["kind"]),
                run_id=body["run_id"],
                step=body["step"],
                cursor=body["cursor"],
                config=body["config"],
                lineage=lineage,
                rng=body["rng"],
                meta=body.get("meta", {}),
                history=HistoryRef.model_validate(body["history"]) if body.get("history") else None,
            )
            body["fingerprint"] = content.fingerprint(
                [(t["name"], t["dtype"], t["shape"], t["checksum"]) for t in body["tensors"]],
                body.get("parts"),
                None if body.get("indexes") is None else index_summary(IndexRef(**r) for r in body["indexes"]),
            )
        except Exception:  # noqa: BLE001 - a deliberately malformed body keeps its old fingerprint
            pass
    store.delete([key])
    assert store.put_if_absent(key, json.dumps(body).encode())


def rewrite_rank_index(
    store: Store,
    ref: CheckpointRef,
    rank: int,
    mutate: Callable[[dict[str, Any]], None],
    *,
    redigest: bool = True,
) -> None:
    """Edit one rank's index object of a v3 checkpoint and make the root agree with it (its
    size and checksum; by default its digest, and so the fingerprint), so the check under test
    is the one that fires."""
    root = json.loads(store.read(f"{ref.prefix}/manifest.json", 1 << 30))
    iref = next(r for r in root["indexes"] if r["rank"] == rank)
    key = f"{ref.prefix}/{iref['key']}"
    body = json.loads(store.read(key, 1 << 30))
    mutate(body)
    raw = json.dumps(body).encode()
    store.delete([key])
    store.write_object(key, [raw], size=len(raw))

    def agree(m: dict[str, Any]) -> None:
        for r in m["indexes"]:
            if r["rank"] == rank:
                r["bytes"], r["checksum"] = len(raw), "blake3:" + blake3(raw).hexdigest()
                if redigest:
                    r["digest"] = summary_of(
                        (t["name"], t["dtype"], t["shape"], t["checksum"]) for t in body["tensors"]
                    )["digest"]

    rewrite_manifest(store, ref, agree)


# -- guards for hostile input: a regression fails instead of hanging or exhausting memory ------
HANG_GUARD_S = 60.0
"""Generous: a regression (a blocking open, an endless read) fails the test instead of hanging it."""
MEMORY_BOUND = 64 << 20


def guarded(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` in a daemon thread; return what it raised (None if it returned)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"still running after {HANG_GUARD_S} s (blocked or reading forever)"
    return outcome[0]


def refused_within_bounds(fn: Callable[[], Any], error: type[E.CairnError]) -> E.CairnError:
    """``fn`` raises exactly the family ``error``, without hanging, within MEMORY_BOUND."""
    tracemalloc.start()
    try:
        exc = guarded(fn)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(exc, error), f"expected {error.__name__}, got {type(exc).__name__}: {exc!r}"
    assert peak < MEMORY_BOUND, f"peak {peak >> 20} MiB"
    assert "\n" not in str(exc)
    return exc


# -- hostile documents ---------------------------------------------------------------------


@pytest.fixture
def rank_order_sums() -> Iterator[Callable[[], None]]:
    """Call it to make this process sum in rank order (the naive fold) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(summing_in("rank-order"))
