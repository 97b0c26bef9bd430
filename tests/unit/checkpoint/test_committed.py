"""One rule for what counts as committed (``cairn.checkpoint.committed``), and nothing in a store
that Cairn did not commit can make it delete, trust or allocate for it.

A signed and an unsigned run each hold two genuine checkpoints (steps 10, 20); foreign objects
are planted at higher steps — junk, a truncated manifest, one of 1 GiB (sparse), another run's
manifest, an unsigned one — then retention runs (``keep_last=3``, no grace), ``latest`` and
resume are asked, and ``ckpt list``/``gc`` report. Before the rule, retention counted every
``manifest.json`` key as a checkpoint, kept the three highest (all junk) and deleted both
genuine ones, and resume picked the junk at the highest step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointOptions, CheckpointRef, Signer, latest_committed
from cairn.checkpoint.committed import judge, list_checkpoints
from cairn.checkpoint.history import read_history
from cairn.checkpoint.latest import read_latest
from cairn.checkpoint.layout import latest_key, manifest_key, pin_key
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, plan_gc
from cairn.config import TrainConfig
from cairn.runs.ownership import claim_run, read_owner
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import refused_within_bounds, small_config

pytestmark = pytest.mark.usefixtures("no_signing_key")

RUN = "genuine"
KEY = "k" * 32
GiB = 1 << 30


def _genuine(store: LocalStore, config: TrainConfig, options: CheckpointOptions) -> None:
    session = TrainingSession.fresh(RUN, store, config, options=options)
    session.run(10)
    session.run(10)
    assert [r.step for r in list_checkpoints(store, RUN, options=options)] == [10, 20]


def _plant(store: LocalStore, step: int, body: bytes) -> Path:
    path = store.root / manifest_key(RUN, CheckpointKind.TRAINING.value, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


def _junk(store: LocalStore, step: int) -> None:
    _plant(store, step, b"{}")


def _truncated(store: LocalStore, step: int) -> None:
    raw = (store.root / manifest_key(RUN, "training", 20)).read_bytes()
    _plant(store, step, raw[: len(raw) // 2])


def _oversized(store: LocalStore, step: int) -> None:
    os.truncate(_plant(store, step, b""), GiB)  # sparse: 1 GiB that costs no disk


def _other_run(store: LocalStore, step: int) -> None:
    signed = CheckpointOptions(signer=Signer(KEY.encode()))
    other = TrainingSession.fresh("other", store, small_config(), options=signed)
    result = other.run(step)
    assert result is not None
    _plant(store, step, (store.root / manifest_key("other", "training", step)).read_bytes())


def _unsigned(store: LocalStore, step: int) -> None:
    """A well-formed manifest of this run at ``step``, committed without the key."""
    session = TrainingSession.fresh(RUN, store, small_config(), options=CheckpointOptions())
    session.run(step)


FOREIGN: dict[str, tuple[Callable[[LocalStore, int], None], bool]] = {
    # name: (plant it at a step, whether it is foreign on an unsigned run too)
    "junk": (_junk, True),
    "truncated": (_truncated, True),
    "oversized": (_oversized, True),
    "other-run": (_other_run, True),
    "unsigned": (_unsigned, False),
}


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_foreign_manifests_are_never_counted_and_no_genuine_checkpoint_is_deleted(
    tmp_path: Path, name: str, signed: bool
) -> None:
    store = LocalStore(tmp_path / "store")
    options = CheckpointOptions(signer=Signer(KEY.encode()) if signed else None)
    _genuine(store, small_config(), options)
    plant, foreign_when_unsigned = FOREIGN[name]
    for step in (30, 40, 50):
        plant(store, step)
    foreign = signed or foreign_when_unsigned

    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=3, grace_seconds=0), options=options)

    genuine = [10, 20] if foreign else [10, 20, 30, 40, 50]
    assert sorted(r.step for r in plan.keep) == genuine[-3:]
    assert sorted(r.step for r in plan.delete) == genuine[:-3]
    for step in genuine[-3:]:  # every checkpoint it kept is whole
        kept = CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, step)
        read_manifest(store, kept, expect_kind=None, options=options)
    if foreign:
        assert sorted(plan.foreign) == [manifest_key(RUN, "training", s) for s in (30, 40, 50)]
        assert all("\n" not in why for why in plan.foreign.values())
        for step in (30, 40, 50):  # left where they are: never deleted automatically
            assert (store.root / manifest_key(RUN, "training", step)).exists()
    ref = latest_committed(store, RUN, options=options)
    assert ref is not None and ref.step == genuine[-1]
    resumed = TrainingSession.resume_latest(RUN, store, small_config(), options=options)
    assert resumed.state.step == genuine[-1]
    assert [r.step for r in list_checkpoints(store, RUN, options=options)] == genuine[-3:]


def test_a_kind_cairn_does_not_know_is_foreign_not_a_crash(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    planted = store.root / RUN / "junkkind" / "000000000099" / "manifest.json"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"{}")
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=0))
    assert [r.step for r in plan.delete] == [10] and [r.step for r in plan.keep] == [20]
    assert f"{RUN}/junkkind/000000000099/manifest.json" in plan.foreign and planted.exists()


def test_the_pointer_naming_a_foreign_step_is_passed_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    _junk(store, 90)
    store.write_object(latest_key(RUN, "training"), [json.dumps({"step": 90, "fingerprint": "x"}).encode()])
    ref = latest_committed(store, RUN)
    assert ref is not None and ref.step == 20
    verdict = judge(store, CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, 90))
    assert verdict is not None and not verdict.committed and isinstance(verdict.refusal, E.CheckpointError)


# -- objects read whole before their size was checked -----------------------------------------------


def test_a_latest_pointer_of_one_gib_is_refused_unread(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    os.truncate(store.root / latest_key(RUN, "training"), GiB)
    assert read_latest(store, RUN, CheckpointKind.TRAINING) is None
    found: list[CheckpointRef | None] = []
    exc = refused_within_bounds(lambda: found.append(latest_committed(store, RUN)) or _raise(), _Done)
    assert isinstance(exc, _Done) and found[0] is not None and found[0].step == 20


def test_a_history_segment_of_one_gib_is_refused_by_its_size(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    ref = CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, 20)
    manifest = read_manifest(store, ref, expect_kind=None)
    assert manifest.history is not None
    segments = sorted((store.root / RUN / "history").rglob("*.bin"))
    for path in segments:
        os.truncate(path, GiB)
    exc = refused_within_bounds(lambda: read_history(store, RUN, manifest.history), E.IntegrityError)  # type: ignore[arg-type]
    assert "wrong size" in str(exc) and str(GiB) in str(exc)
    exc = refused_within_bounds(lambda: load_training(store, ref), E.IntegrityError)
    assert "wrong size" in str(exc)


def test_gc_with_a_kept_manifest_of_one_gib_stays_within_memory(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    _oversized(store, 30)
    plans: list[object] = []
    policy = RetentionPolicy(keep_last=3, grace_seconds=0)
    exc = refused_within_bounds(lambda: plans.append(plan_gc(store, RUN, policy)) or _raise(), _Done)
    assert isinstance(exc, _Done)
    plan = plans[0]
    assert manifest_key(RUN, "training", 30) in plan.foreign  # type: ignore[attr-defined]
    assert "1073741824" in plan.foreign[manifest_key(RUN, "training", 30)]  # type: ignore[attr-defined]


# -- pins and owner records: the bounded JSON reader, typed one-line errors -------------------------

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize(
    "body",
    [DEEP, b'{"kind": "training", "step": Infinity}', b'{"kind": "training", "step": 1e400}', b"\xff", b"[]"],
    ids=["deep", "infinity", "overflow", "binary", "not-an-object"],
)
def test_a_hostile_pin_pins_nothing_and_gc_goes_on(tmp_path: Path, body: bytes) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    store.write_object(pin_key(RUN, "evil"), [body])
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=0))
    assert [r.step for r in plan.keep] == [20] and [r.step for r in plan.delete] == [10]
    why = plan.foreign[pin_key(RUN, "evil")]
    assert "\n" not in why and "Recursion" not in why and "Overflow" not in why


@pytest.mark.parametrize("body", [DEEP, b'{"run_id": Infinity}', b"x" * (2 * GiB // 1024)], ids=["deep", "inf", "big"])
def test_a_hostile_owner_record_names_no_owner_and_the_run_can_be_claimed(tmp_path: Path, body: bytes) -> None:
    store = LocalStore(tmp_path / "store")
    store.write_object(f"{RUN}/owners/000000000000.json", [body])
    assert read_owner(store, RUN) is None
    record = claim_run(store, RUN, "wf-1", "s" * 32, owner_running=lambda _: True)
    assert record.workflow_id == "wf-1" and read_owner(store, RUN) == record


class _Done(E.CairnError):
    """Raised after a call that must succeed, so ``refused_within_bounds`` measures it too."""


def _raise() -> None:
    raise _Done("done")


# -- found in review: shapes the checks did not expect, keys that verify nothing, writers that converge

MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "version-list": lambda m: m.update(format_version=[]),
    "version-dict": lambda m: m.update(format_version={}),
    "signature-not-ascii": lambda m: m.update(signature="hmac-sha256:\u00e9"),
    "signature-number": lambda m: m.update(signature=7),
    "tensors-object": lambda m: m.update(tensors={"a": 1}),
    "step-string": lambda m: m.update(step="30"),
    "writer-list": lambda m: m.update(writer=[]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_manifest_of_unexpected_shapes_is_foreign_not_a_crash(tmp_path: Path, name: str) -> None:
    store = LocalStore(tmp_path / "store")
    options = CheckpointOptions(signer=Signer(KEY.encode()))
    _genuine(store, small_config(), options)
    body = json.loads((store.root / manifest_key(RUN, "training", 20)).read_bytes())
    body.update(step=30)
    MALFORMED[name](body)
    _plant(store, 30, json.dumps(body).encode())
    ref = latest_committed(store, RUN, options=options)
    assert ref is not None and ref.step == 20
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=0), options=options)
    assert [r.step for r in plan.keep] == [20] and manifest_key(RUN, "training", 30) in plan.foreign


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_judging_any_mutation_of_a_manifest_gives_a_verdict(
    tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    """Whatever a manifest's fields hold, judging it answers committed or foreign, never raises."""
    store = LocalStore(tmp_path_factory.mktemp("fuzz"))
    options = CheckpointOptions(signer=Signer(KEY.encode()))
    write = TrainingSession.fresh(RUN, store, small_config(), options=options).run(3)
    assert write is not None
    body = json.loads((store.root / manifest_key(RUN, "training", 3)).read_bytes())
    values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    )
    for key in data.draw(st.lists(st.sampled_from(sorted(body)), min_size=1, max_size=3, unique=True)):
        body[key] = data.draw(values)
    _plant(store, 3, json.dumps(body).encode())
    verdict = judge(store, CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, 3), options)
    assert verdict is not None
    assert verdict.committed or ("\n" not in str(verdict.refusal) and isinstance(verdict.refusal, E.CairnError))


def test_a_pin_of_an_unhashable_kind_pins_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions())
    store.write_object(pin_key(RUN, "evil"), [b'{"kind": [], "step": 10}'])
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=0))
    assert [r.step for r in plan.delete] == [10] and pin_key(RUN, "evil") in plan.foreign


def test_checkpoints_no_key_verifies_are_an_error_never_a_fresh_start(tmp_path: Path) -> None:
    """A rotated or wrong key on a worker: the run's checkpoints exist and none verifies. Resume
    must say so, not start the run over from step 0 (and write over nothing)."""
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions(signer=Signer(KEY.encode())))
    other = CheckpointOptions(signer=Signer(b"another key, 32 bytes long......"))
    with pytest.raises(E.SignatureError, match="none verifies"):
        latest_committed(store, RUN, options=other)
    with pytest.raises(E.SignatureError):
        TrainingSession.resume_latest(RUN, store, small_config(), options=other)
    junk_only = LocalStore(tmp_path / "junk")
    _junk(junk_only, 50)  # not a signature problem: nothing of this run is Cairn's, it starts fresh
    assert latest_committed(junk_only, RUN, options=other) is None


def test_gc_without_the_key_deletes_nothing_of_a_signed_run(tmp_path: Path) -> None:
    """Forged unsigned manifests at higher steps pass the rule where no key is configured; on a run
    whose checkpoints are signed, GC without the key therefore deletes no checkpoint and says why."""
    store = LocalStore(tmp_path / "store")
    _genuine(store, small_config(), CheckpointOptions(signer=Signer(KEY.encode())))
    for step in (30, 40, 50):
        _unsigned(store, step)
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=3, grace_seconds=0), options=CheckpointOptions())
    assert plan.delete == [] and sorted(r.step for r in plan.keep) == [10, 20, 30, 40, 50]
    assert plan.notes and "signing key" in plan.notes[0]
    signed = CheckpointOptions(signer=Signer(KEY.encode()))
    assert [r.step for r in list_checkpoints(store, RUN, options=signed)] == [10, 20]


@pytest.mark.parametrize("planted", ["junk", "unsigned"])
def test_a_commit_never_converges_on_an_object_cairn_did_not_commit(tmp_path: Path, planted: str) -> None:
    """A step's manifest key already holds something: the writer compares it as a reader would
    (signature included) and refuses to take it for its own state."""
    store = LocalStore(tmp_path / "store")
    options = CheckpointOptions(signer=Signer(KEY.encode()))
    session = TrainingSession.fresh(RUN, store, small_config(), options=options)
    FOREIGN[planted][0](store, 10)
    with pytest.raises(E.CheckpointConflictError, match="did not commit"):
        session.run(10)
