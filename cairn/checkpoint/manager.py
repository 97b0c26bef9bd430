"""The manager layer: training state <-> checkpoints, listing, latest committed.

Short functions that wire the state, the format and the store together. Listing sees only
committed checkpoints (a manifest exists); a half-written prefix is invisible here.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from cairn.checkpoint.format import (
    DEFAULT_LIMITS,
    CheckpointContent,
    CommitResult,
    Limits,
    read_manifest,
    read_tensors,
    write_checkpoint,
)
from cairn.checkpoint.manifest import MANIFEST_NAME, CheckpointKind, Manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.signing import Signer, signer_from_env
from cairn.checkpoint.validate import check_training_manifest, check_training_values
from cairn.config import TrainConfig
from cairn.state import HISTORY_KEYS, TrainState
from cairn.stores.base import Store

__all__ = [
    "training_tensors",
    "training_content",
    "save_training",
    "load_training",
    "list_checkpoints",
    "latest_committed",
    "ENV_SIGNER",
    "resolve_signer",
]

_MANIFEST_RE = re.compile(r"(?:^|/)([^/]+)/([a-z]+)/(\d{12})/" + re.escape(MANIFEST_NAME) + "$")


class _EnvSigner:
    """Sentinel: resolve the signer from the environment at call time."""


ENV_SIGNER: Any = _EnvSigner()


def resolve_signer(signer: Signer | None | _EnvSigner) -> Signer | None:
    return signer_from_env() if isinstance(signer, _EnvSigner) else signer


def training_tensors(state: TrainState) -> dict[str, np.ndarray]:
    """The arrays of a training state, by checkpoint tensor name (views, not copies)."""
    tensors: dict[str, np.ndarray] = {}
    for name in state.params:
        tensors[f"theta/{name}"] = state.params[name]
        tensors[f"adam.m/{name}"] = state.m[name]
        tensors[f"adam.v/{name}"] = state.v[name]
    for key in HISTORY_KEYS:
        tensors[f"history/{key}"] = np.asarray(state.history[key], dtype=np.float64)
    return tensors


def training_content(run_id: str, state: TrainState) -> CheckpointContent:
    """Everything but the tensors of a training checkpoint of ``state``."""
    return CheckpointContent(
        kind=CheckpointKind.TRAINING,
        run_id=run_id,
        step=state.step,
        cursor=state.cursor,
        config=state.config.model_dump(mode="json"),
        lineage=state.lineage,
        rng=state.rng_state,
    )


def save_training(
    store: Store,
    run_id: str,
    state: TrainState,
    *,
    signer: Signer | None | _EnvSigner = ENV_SIGNER,
    **write_options: Any,
) -> CommitResult:
    """Commit the full training state under (run_id, training, step)."""
    content = training_content(run_id, state)
    return write_checkpoint(store, content, training_tensors(state), signer=resolve_signer(signer), **write_options)


def load_training(
    store: Store,
    ref: CheckpointRef,
    *,
    run_config: TrainConfig | None = None,
    dataset_hash: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    signer: Signer | None | _EnvSigner = ENV_SIGNER,
) -> tuple[TrainState, Manifest]:
    """Validate a training checkpoint completely and build a new TrainState from it.

    Nothing is returned (and so nothing can replace a run's state) unless every rule passed.
    """
    manifest = read_manifest(
        store, ref, expect_kind=CheckpointKind.TRAINING, limits=limits, signer=resolve_signer(signer)
    )
    config = check_training_manifest(manifest, run_config=run_config, dataset_hash=dataset_hash)
    arrays = read_tensors(store, ref, manifest, value_check=check_training_values)
    assert manifest.lineage is not None and manifest.rng is not None  # checked above
    group: dict[str, dict[str, np.ndarray]] = {"theta": {}, "adam.m": {}, "adam.v": {}}
    for name, arr in arrays.items():
        head, _, tail = name.partition("/")
        if head in group:
            group[head][tail] = arr
    state = TrainState(
        config=config,
        lineage=manifest.lineage.model_copy(update={"parent": manifest.fingerprint}),
        params=group["theta"],
        m=group["adam.m"],
        v=group["adam.v"],
        step=manifest.step,
        cursor=manifest.cursor,
        rng_state=dict(manifest.rng),
        history={k: arrays[f"history/{k}"].tolist() for k in HISTORY_KEYS},
    )
    return state, manifest


def list_checkpoints(
    store: Store, run_id: str | None = None, kind: CheckpointKind | None = None
) -> list[CheckpointRef]:
    """Committed checkpoints, sorted by (run, kind, step)."""
    refs: list[CheckpointRef] = []
    for info in store.list(f"{run_id}/" if run_id else ""):
        match = _MANIFEST_RE.search(info.key)
        if not match or match.start() != 0:
            continue
        run, kind_text, step = match.groups()
        try:
            found_kind = CheckpointKind(kind_text)
        except ValueError:
            continue
        if kind is not None and found_kind != kind:
            continue
        refs.append(CheckpointRef(store.url, run, found_kind, int(step)))
    return sorted(refs, key=lambda r: (r.run_id, r.kind.value, r.step))


def latest_committed(store: Store, run_id: str, kind: CheckpointKind = CheckpointKind.TRAINING) -> CheckpointRef | None:
    """The highest committed step of this run and kind: the last durable cursor."""
    refs = list_checkpoints(store, run_id, kind)
    return refs[-1] if refs else None
