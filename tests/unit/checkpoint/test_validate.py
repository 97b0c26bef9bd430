"""Each validation rule: a checkpoint broken that way is refused with its typed error, and the
run that tried to import it is untouched."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import (
    CheckpointContent,
    CheckpointKind,
    CheckpointOptions,
    CheckpointRef,
    Limits,
    Signer,
    write_checkpoint,
)
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.validate import check_training_manifest
from cairn.training import load_training
from tests.conftest import rewrite_manifest, small_config, write_broken


@pytest.fixture
def session(local_store: LocalStore, config: TrainConfig) -> TrainingSession:
    s = TrainingSession.fresh("victim", local_store, config)
    s.run(5)
    return s


@pytest.fixture
def good(local_store: LocalStore, config: TrainConfig) -> CheckpointRef:
    donor = TrainingSession.fresh("donor", local_store, config)
    result = donor.run(9)
    assert result is not None
    return result.ref


def assert_refused(
    session: TrainingSession, ref: CheckpointRef, error: type[E.CheckpointError], field: str
) -> E.CheckpointError:
    before = session.state.copy()
    before_commit = session.last_commit
    with pytest.raises(error) as info:
        session.restore(ref)
    assert compare_states(session.state, before) == [], "a refused import changed the run"
    assert session.last_commit is before_commit
    assert field in str(info.value), f"message should name {field!r}: {info.value}"
    return info.value


def test_the_runs_config_builds_the_trainer_that_validates(
    good: CheckpointRef, local_store: LocalStore, config: TrainConfig
) -> None:
    """With a run config the trainer is built from it (the checkpoint's config is only compared
    with it); the checkpoint's own config is what the state holds."""
    manifest = read_manifest(local_store, good, expect_kind=CheckpointKind.TRAINING)
    given = config.model_copy(update={"optimizer": config.optimizer.model_copy(update={"lr": 0.5})})
    found, trainer = check_training_manifest(manifest, run_config=given)
    assert trainer.config == given and found == config
    differing = config.model_copy(update={"model": config.model.model_copy(update={"hidden": 4})})
    with pytest.raises(E.IncompatibleConfigError) as info:
        check_training_manifest(manifest, run_config=differing)
    assert (info.value.field, info.value.expected, info.value.found) == ("config.model.hidden", 4, config.model.hidden)


def test_good_checkpoint_restores(session: TrainingSession, good: CheckpointRef) -> None:
    session.restore(good)
    assert session.state.step == 9


def test_missing_manifest(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    local_store.delete([f"{good.prefix}/manifest.json"])
    assert_refused(session, good, E.CheckpointNotFoundError, "manifest missing")


def test_format_version(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    rewrite_manifest(local_store, good, lambda m: m.update(format_version=99))
    err = assert_refused(session, good, E.FormatVersionError, "format_version")
    assert err.expected == [1, 2, 3] and err.found == 99


def test_kind_mismatch(session: TrainingSession, local_store: LocalStore) -> None:
    content = CheckpointContent(kind=CheckpointKind.JOURNAL, run_id="victim", step=3, meta={"entries": []})
    ref = write_checkpoint(local_store, content, {}).ref
    training_slot = CheckpointRef(ref.store_url, ref.run_id, CheckpointKind.JOURNAL, ref.step)
    err = assert_refused(session, training_slot, E.KindMismatchError, "kind")
    assert err.expected == "training" and err.found == "journal"


def test_manifest_not_json(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    key = f"{good.prefix}/manifest.json"
    local_store.delete([key])
    local_store.put_if_absent(key, b"{not json")
    assert_refused(session, good, E.ManifestError, "not valid JSON")


def test_manifest_schema(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    rewrite_manifest(local_store, good, lambda m: m.update(total_bytes="lots"))
    assert_refused(session, good, E.ManifestError, "total_bytes")


def test_manifest_too_big(session: TrainingSession, good: CheckpointRef) -> None:
    session.options = CheckpointOptions(limits=Limits(max_manifest_bytes=512))
    assert_refused(session, good, E.SizeLimitError, "manifest")


def test_too_many_tensors(session: TrainingSession, good: CheckpointRef) -> None:
    session.options = CheckpointOptions(limits=Limits(max_tensors=4))
    assert_refused(session, good, E.SizeLimitError, "tensors")


def test_total_bytes_bound_refused_before_allocation(
    session: TrainingSession, good: CheckpointRef, local_store: LocalStore
) -> None:
    # Declare an absurd tensor: refused from the manifest, never allocated (a 2**40-element array).
    def huge(m: dict[str, Any]) -> None:
        t = m["tensors"][0]
        t["shape"] = [2**20, 2**20]
        t["length"] = 8 * 2**40
        m["total_bytes"] = sum(x["length"] for x in m["tensors"])

    rewrite_manifest(local_store, good, huge)
    assert_refused(session, good, E.SizeLimitError, "total_bytes")


def test_length_disagrees_with_shape(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    rewrite_manifest(local_store, good, lambda m: m["tensors"][0].update(length=m["tensors"][0]["length"] - 8))
    assert_refused(session, good, E.TensorSpecError, "length")


def test_wrong_dtype(session: TrainingSession, local_store: LocalStore) -> None:
    def to_f4(a: dict[str, np.ndarray]) -> None:
        a["theta/W1"] = a["theta/W1"].astype(np.float32)

    ref = write_broken(local_store, "broken", session.state, tensors=to_f4)
    err = assert_refused(session, ref, E.TensorSpecError, "theta/W1")
    assert err.expected == "<f8" and err.found == "<f4"


def test_moment_not_shaped_like_theta(session: TrainingSession, local_store: LocalStore) -> None:
    def reshape(a: dict[str, np.ndarray]) -> None:
        a["adam.m/W1"] = a["adam.m/W1"].reshape(-1)

    ref = write_broken(local_store, "broken", session.state, tensors=reshape)
    assert_refused(session, ref, E.TensorSpecError, "adam.m/W1")


def test_missing_tensor(session: TrainingSession, local_store: LocalStore) -> None:
    ref = write_broken(local_store, "broken", session.state, tensors=lambda a: a.pop("adam.v/b2"))
    assert_refused(session, ref, E.TensorSpecError, "adam.v/b2")


def test_checksum(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    manifest = json.loads(local_store.read(f"{good.prefix}/manifest.json", 1 << 30))
    shard = manifest["shards"][0]["key"]
    path = local_store.root / good.prefix / shard
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01  # one flipped bit
    path.write_bytes(bytes(data))
    assert_refused(session, good, E.IntegrityError, "checksum")


def test_missing_shard(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    manifest = json.loads(local_store.read(f"{good.prefix}/manifest.json", 1 << 30))
    local_store.delete([f"{good.prefix}/{manifest['shards'][0]['key']}"])
    assert_refused(session, good, E.IntegrityError, "missing")


def test_fingerprint(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    rewrite_manifest(local_store, good, lambda m: m.update(cursor=m["cursor"] + 2), refingerprint=False)
    assert_refused(session, good, E.IntegrityError, "fingerprint")


def test_location_mismatch(session: TrainingSession, good: CheckpointRef, local_store: LocalStore) -> None:
    rewrite_manifest(local_store, good, lambda m: m.update(run_id="someone-else"))
    assert_refused(session, good, E.IntegrityError, "run_id")


def test_non_finite(session: TrainingSession, local_store: LocalStore) -> None:
    def nan(a: dict[str, np.ndarray]) -> None:
        a["theta/b1"][0] = np.nan

    ref = write_broken(local_store, "broken", session.state, tensors=nan)
    assert_refused(session, ref, E.NonFiniteError, "theta/b1")


def test_negative_second_moment(session: TrainingSession, local_store: LocalStore) -> None:
    def negative(a: dict[str, np.ndarray]) -> None:
        a["adam.v/W2"][0, 0] = -1e-3

    ref = write_broken(local_store, "broken", session.state, tensors=negative)
    assert_refused(session, ref, E.InvariantError, "adam.v/W2")


def test_cursor_invariant(session: TrainingSession, local_store: LocalStore) -> None:
    ref = write_broken(local_store, "broken", session.state, cursor=session.state.cursor + 1)
    err = assert_refused(session, ref, E.InvariantError, "cursor")
    assert err.expected == session.state.step * 2


def test_history_length_invariant(session: TrainingSession, local_store: LocalStore) -> None:
    def short(a: dict[str, np.ndarray]) -> None:
        a["history/loss"] = a["history/loss"][:-1]

    ref = write_broken(local_store, "broken", session.state, tensors=short)
    assert_refused(session, ref, E.InvariantError, "history/loss")


@pytest.mark.parametrize(
    "rng, field",
    [
        ({"bit_generator": "MT19937", "state": {}}, "rng.bit_generator"),
        (
            {"bit_generator": "PCG64", "state": {"state": -1, "inc": 1}, "has_uint32": 0, "uinteger": 0},
            "rng.state.state",
        ),
        (
            {"bit_generator": "PCG64", "state": {"state": 5, "inc": 1}, "has_uint32": 7, "uinteger": 0},
            "rng.has_uint32",
        ),
        (None, "rng"),
    ],
)
def test_rng_malformed(session: TrainingSession, local_store: LocalStore, rng: Any, field: str) -> None:
    ref = write_broken(local_store, "broken", session.state, rng=rng)
    assert_refused(session, ref, E.InvariantError, field)


def test_rng_even_increment(session: TrainingSession, local_store: LocalStore) -> None:
    bad = dict(session.state.rng_state)
    bad["state"] = {"state": bad["state"]["state"], "inc": bad["state"]["inc"] + 1}
    ref = write_broken(local_store, "broken", session.state, rng=bad)
    assert_refused(session, ref, E.InvariantError, "rng.state.inc")


def test_incompatible_model(session: TrainingSession, local_store: LocalStore) -> None:
    other = TrainingSession.fresh(
        "victim",
        local_store,
        small_config(model={"hidden": 4}),
    )
    other.run_id = "other"
    result = other.run(2)
    assert result is not None
    err = assert_refused(session, result.ref, E.IncompatibleConfigError, "config.model.hidden")
    assert err.expected == 16 and err.found == 4


def test_incompatible_dataset(session: TrainingSession, local_store: LocalStore, config: TrainConfig) -> None:
    lineage = session.state.lineage.model_copy(update={"dataset_hash": "sha256:" + "0" * 64})
    ref = write_broken(local_store, "broken", session.state, lineage=lineage)
    assert_refused(session, ref, E.IncompatibleConfigError, "lineage.dataset_hash")


@pytest.mark.usefixtures("no_signing_key")
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


class TestSignatures:
    KEY = b"0123456789abcdef-test-key"

    def test_unsigned_refused_when_key_configured(
        self, local_store: LocalStore, config: TrainConfig, good: CheckpointRef, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CAIRN_SIGNING_KEY", self.KEY.decode())
        keyed = TrainingSession.fresh("keyed", local_store, config)  # a session reads the key once, when made
        keyed.run(5)
        assert_refused(keyed, good, E.SignatureError, "signature")

    def test_signed_roundtrip_and_tamper(
        self, local_store: LocalStore, config: TrainConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CAIRN_SIGNING_KEY", self.KEY.decode())
        signed = TrainingSession.fresh("signed", local_store, config)
        result = signed.run(4)
        assert result is not None and result.manifest.signature
        state, _ = load_training(local_store, result.ref)
        assert state.step == 4
        # Tampering with content and recomputing the (public) fingerprint is not enough.
        rewrite_manifest(local_store, result.ref, lambda m: m["lineage"].update(stage_contract="forged"))
        with pytest.raises(E.SignatureError):
            load_training(local_store, result.ref)
        # A different key is refused too.
        with pytest.raises(E.SignatureError):
            load_training(local_store, result.ref, options=CheckpointOptions(signer=Signer(b"another-key-of-16+bytes")))

    def test_key_file(
        self, tmp_path: Any, local_store: LocalStore, config: TrainConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        key = tmp_path / "key"
        key.write_bytes(self.KEY + b"\n")
        monkeypatch.setenv("CAIRN_SIGNING_KEY_FILE", str(key))
        result = TrainingSession.fresh("kf", local_store, config).run(2)
        assert result is not None
        assert result.manifest.signature == Signer(self.KEY).sign(result.manifest.signed_payload())


@pytest.mark.parametrize("with_trainer", [True, False])
def test_malformed_trainer_state_is_refused_typed_before_the_trainer_sizes_the_checkpoint(
    local_store: LocalStore, with_trainer: bool
) -> None:
    """The run's bounds come from the trainer's specs, which read ``meta``: a forged ``meta`` is
    refused by the trainer's own state check (typed), never with whatever the specs raise."""
    from cairn.trainers.loading import load_trainer
    from tests.conftest import digits_config

    config = digits_config()
    ref = TrainingSession.fresh("forged-meta", local_store, config).run(2).ref
    rewrite_manifest(local_store, ref, lambda b: b["meta"]["optimizer"].update(with_state=[{"x": 1}]))
    with pytest.raises(E.InvariantError) as info:
        load_training(local_store, ref, trainer=load_trainer(config) if with_trainer else None)
    assert info.value.field == "meta.optimizer.with_state"
