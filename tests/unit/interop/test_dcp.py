"""PyTorch Distributed Checkpoint in and out: ``export_dcp`` writes what ``dcp.load`` reads into
``get_state_dict(model, optimizer)`` (one process, and FSDP2 over two), bit for bit, the optimizer
moments included; ``init_from.dcp`` imports a ``dcp.save`` of a plain model (Cairn's layout or
TorchTitan's) and a sharded FSDP2 save. The ``.metadata`` pickle is read as data: a payload naming
``os.system`` or ``builtins.eval`` is refused and never runs (the file it would write is never
written); a truncated ``.distcp``, an oversized ``.metadata``, foreign keys and shapes are refused
in one line."""

from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from cairn import errors as E
from cairn.checkpoint import CheckpointOptions
from cairn.config import InitFrom, TrainConfig
from cairn.gang import free_port
from cairn.interop import export_dcp, read_dcp_weights
from cairn.interop.dcp_metadata import MAX_METADATA_BYTES
from cairn.interop.pickle_data import read_pickle
from cairn.interop.weights import content_hash
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch.state_io import to_numpy
from cairn.trainers.stages import initial_state
from cairn.training import load_training
from examples.digits import DigitsNet
from tests.conftest import digits_config, refused_within_bounds

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

CHANNELS, HIDDEN = 4, 16
"""``digits_config``'s model."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainState:
    """A digits checkpoint after 6 AdamW updates (moments and step counts non-trivial), read back
    with every check."""
    root = tmp_path_factory.mktemp("trained")
    result = TrainingSession.fresh("run", root / "store", digits_config()).run(6)
    assert result is not None
    state, _ = load_training(LocalStore(root / "store"), result.ref, run_config=digits_config())
    return state


def fresh_model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(123)
    model = DigitsNet(CHANNELS, HIDDEN)
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def staged(path: Path) -> TrainConfig:
    body = digits_config().model_dump(mode="json")
    return TrainConfig.model_validate({**body, "stage": "import", "init_from": {"dcp": str(path)}})


def imported(path: Path) -> TrainState:
    """Step 0 of a stage on the DCP at ``path`` (what the run's first segment computes)."""
    return initial_state(load_trainer(staged(path)), options=CheckpointOptions())


def saved(path: Path, state_dict: dict[str, Any]) -> Path:
    dcp.save(state_dict, checkpoint_id=path, no_dist=True)
    return path


def plain_model(seed: int = 7, **sizes: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return DigitsNet(sizes.get("channels", CHANNELS), sizes.get("hidden", HIDDEN))


# -- out: dcp.load reads the export ---------------------------------------------------------------


def test_dcp_load_restores_the_checkpoints_model_and_optimizer_bit_for_bit(trained: TrainState, tmp_path: Path) -> None:
    result = export_dcp(trained, load_trainer(digits_config()), tmp_path / "out")
    assert result.kind == "dcp" and ".metadata" in result.files and result.tensors > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the hidden sibling renamed away
    model, optimizer = fresh_model_and_optimizer()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=tmp_path / "out")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    for key, tensor in model.state_dict().items():
        name = f"param/{key}" if f"param/{key}" in trained.tensors else f"buffer/{key}"
        assert to_numpy(tensor).tobytes() == trained.tensors[name].tobytes(), key
    names = dict(model.named_parameters())
    assert set(trained.meta["optimizer"]["with_state"]) == set(names)
    for name, param in names.items():
        moments = optimizer.state[param]
        assert set(moments) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in moments.items():
            assert to_numpy(value).tobytes() == trained.tensors[f"optim/{name}/{key}"].tobytes(), (name, key)
    kept = trained.meta["optimizer"]["param_groups"][0]
    group = optimizer.param_groups[0]
    assert group["lr"] == kept["lr"] != 0.5 and group["betas"] == tuple(kept["betas"])


def test_a_hugging_face_export_with_tied_weights_loads_and_imports(tmp_path: Path) -> None:
    """GPT-2's ``lm_head.weight`` (tied to the embedding) is in the export, as in its
    ``get_state_dict``; the trainer's own model and optimizer (two param groups) load it, and a
    stage imports it."""
    pytest.importorskip("transformers")
    from tests.conftest import hf_config

    config = hf_config("gpt2")
    done = TrainingSession.fresh("run", tmp_path / "store", config).run(3)
    assert done is not None
    state, _ = load_training(LocalStore(tmp_path / "store"), done.ref, run_config=config)
    export_dcp(state, load_trainer(config), tmp_path / "out")
    trainer: Any = load_trainer(config)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    assert "lm_head.weight" in model_sd and len(trainer.optimizer.param_groups) == 2
    loaded = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(loaded, checkpoint_id=tmp_path / "out")
    set_state_dict(
        trainer.model, trainer.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"]
    )
    for name, param in trainer.model.named_parameters():
        assert to_numpy(param).tobytes() == state.tensors[f"param/{name}"].tobytes(), name
        for key, value in trainer.optimizer.state[param].items():
            assert to_numpy(value).tobytes() == state.tensors[f"optim/{name}/{key}"].tobytes(), (name, key)
    body = config.model_dump(mode="json")
    stage = TrainConfig.model_validate({**body, "stage": "import", "init_from": {"dcp": str(tmp_path / "out")}})
    staged_state = initial_state(load_trainer(stage), options=CheckpointOptions())
    assert all(staged_state.tensors[n].tobytes() == a.tobytes() for n, a in state.tensors.items() if n[:6] == "param/")


def test_weights_only_writes_the_model_alone(trained: TrainState, tmp_path: Path) -> None:
    result = export_dcp(trained, load_trainer(digits_config()), tmp_path / "out", weights_only=True)
    assert result.kind == "dcp-weights-only"
    state = imported(tmp_path / "out")
    assert all(state.tensors[n].tobytes() == trained.tensors[n].tobytes() for n in state.tensors if n[:6] == "param/")


def test_an_export_to_a_directory_that_is_not_empty_is_refused(trained: TrainState, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    with pytest.raises(E.ConfigError, match="not empty"):
        export_dcp(trained, load_trainer(digits_config()), tmp_path / "out")


# -- in: init_from.dcp ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["cairn", "torchtitan"])
def test_a_dcp_save_of_a_plain_model_starts_a_stage(tmp_path: Path, layout: str) -> None:
    model, optimizer = plain_model(), None
    sd = model.state_dict()
    if layout == "cairn":
        source = saved(tmp_path / "dcp", {"model": sd})
    else:  # the model's keys at the top level, beside the optimizer and the training state
        optimizer = torch.optim.AdamW(model.parameters())
        _, optim_sd = get_state_dict(model, optimizer)
        body = {**sd, "optimizer": optim_sd, "train_state": {"step": torch.tensor(3)}}
        source = saved(tmp_path / "dcp", body)
    state = imported(source)
    for key, tensor in sd.items():
        name = f"param/{key}" if f"param/{key}" in state.tensors else f"buffer/{key}"
        assert state.tensors[name].tobytes() == to_numpy(tensor).tobytes(), key
    assert not any(name.startswith("optim/") for name in state.tensors)  # weights only: a fresh optimizer
    reference = state.lineage.reference
    assert reference is not None and reference.checkpoint == f"dcp:{source.resolve()}"
    assert reference.fingerprint == content_hash([source / ".metadata", *sorted(source.glob("*.distcp"))])
    assert state.step == 0


def test_the_export_imports_as_the_checkpoints_weights(trained: TrainState, tmp_path: Path) -> None:
    export_dcp(trained, load_trainer(digits_config()), tmp_path / "out")
    session = TrainingSession.fresh("staged", tmp_path / "store", staged(tmp_path / "out"))
    weights = {n: a for n, a in trained.tensors.items() if n.startswith(("param/", "buffer/"))}
    assert all(session.state.tensors[n].tobytes() == a.tobytes() for n, a in weights.items())
    assert session.run(1) is not None  # and it trains


def test_init_from_takes_exactly_one_source_and_dumps_as_before() -> None:
    assert InitFrom(dcp="x").model_dump() == {"dcp": "x", "may_change": ["optimizer", "data"]}
    assert "dcp" not in InitFrom(checkpoint="runs/r/training/000000000001").model_dump()
    with pytest.raises(ValueError, match="exactly one of checkpoint, safetensors or dcp"):
        InitFrom(dcp="x", safetensors="y")


def refused(path: Path, error: type[E.CairnError] = E.CairnError) -> E.CairnError:
    """The refusal of ``path`` by the import, in one line, within bounds; the trainer (and its
    data) built first, outside the bound."""
    trainer = load_trainer(staged(path))
    fresh = trainer.init_state().tensors
    exc = refused_within_bounds(lambda: read_dcp_weights(path, trainer, fresh), error)
    assert str(exc).startswith("init_from.dcp"), exc
    return exc


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ("extra", ["unknown", "model.extra.weight"]),
        ("missing", ["missing", "head.3.bias"]),
        ("shape", ["model.head.1.", "expected <f4[16", "found <f4[32"]),
        ("not a tensor", ["model.head.3.bias", "a pickled Python object"]),
        ("other group", ["unknown", "scheduler.last_epoch"]),
    ],
)
def test_foreign_keys_and_shapes_are_refused_in_one_line(tmp_path: Path, change: str, needles: list[str]) -> None:
    sd: dict[str, Any] = dict(plain_model().state_dict())
    body: dict[str, Any] = {"model": sd}
    if change == "extra":
        sd["extra.weight"] = torch.zeros(2)
    elif change == "missing":
        del sd["head.3.bias"]
    elif change == "shape":
        body["model"] = plain_model(hidden=32).state_dict()
    elif change == "not a tensor":
        sd["head.3.bias"] = 0.5
    else:
        body["scheduler"] = {"last_epoch": torch.tensor(1)}
    error = refused(saved(tmp_path / "dcp", body), E.TensorSpecError)
    assert all(needle in str(error) for needle in needles), error


# -- hostile directories ----------------------------------------------------------------------------


def _payloads(marker: Path) -> dict[str, tuple[bytes, str]]:
    """Pickles that would write ``marker`` if unpickled, and the callable each names."""
    command = f"touch {marker}".encode()
    code = f"open({str(marker)!r}, 'w').write('ran')".encode()
    return {
        "os.system, protocol 0": (b"cos\nsystem\n(S'" + command + b"'\ntR.", "os.system"),
        "os.system, protocol 4": (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(command)]) + command + b"\x85R.",
            "os.system",
        ),
        "builtins.eval": (b"cbuiltins\neval\n(V" + code + b"\ntR.", "builtins.eval"),
    }


@pytest.mark.parametrize("name", ["os.system, protocol 0", "os.system, protocol 4", "builtins.eval"])
def test_a_metadata_pickle_naming_a_foreign_callable_is_refused_without_running_it(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    raw, callable_name = _payloads(marker)[name]
    source = saved(tmp_path / "dcp", {"model": plain_model().state_dict()})
    (source / ".metadata").write_bytes(raw)
    error = refused(source, E.ManifestError)
    assert not marker.exists()  # plain pickle.load would have written it by now
    assert ".metadata" in str(error) and "DCP metadata classes" in str(error) and callable_name in str(error)
    with pytest.raises(E.ManifestError, match=f"found {callable_name}"):
        TrainingSession.fresh("staged", tmp_path / "store", staged(source))
    assert not marker.exists()


class _Payload:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (self.command,)


def test_a_payload_inside_real_metadata_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = saved(tmp_path / "dcp", {"model": plain_model().state_dict()})
    with open(source / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # the test's own file
    metadata.storage_meta = _Payload(f"touch {marker}")
    (source / ".metadata").write_bytes(pickle.dumps(metadata))
    error = refused(source, E.ManifestError)
    assert not marker.exists()
    assert f"found {os.system.__module__}.system" in str(error)


def _rewrite_item(source: Path, key: str, data_pkl: bytes) -> None:
    """The chunk of ``key`` re-archived with ``data_pkl`` and appended to its file, the metadata
    pointing at it."""
    with open(source / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    index = next(i for i in metadata.storage_data if i.fqn == key)
    info = metadata.storage_data[index]
    path = source / info.relative_path
    body = path.read_bytes()
    old = zipfile.ZipFile(io.BytesIO(body[info.offset : info.offset + info.length]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as new:
        for member in old.infolist():
            new.writestr(member.filename, data_pkl if member.filename.endswith("data.pkl") else old.read(member))
    path.write_bytes(body + out.getvalue())
    metadata.storage_data[index] = type(info)(info.relative_path, len(body), len(out.getvalue()))
    (source / ".metadata").write_bytes(pickle.dumps(metadata))


def test_a_tensor_archive_naming_a_foreign_callable_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    source = saved(tmp_path / "dcp", {"model": plain_model().state_dict()})
    _rewrite_item(source, "model.head.3.bias", _payloads(marker)["os.system, protocol 0"][0])
    error = refused(source, E.TensorSpecError)
    assert not marker.exists()
    assert "model.head.3.bias" in str(error) and "torch.save tensor classes" in str(error) and "os.system" in str(error)


def test_a_truncated_distcp_is_refused_naming_the_file(tmp_path: Path) -> None:
    source = saved(tmp_path / "dcp", {"model": plain_model().state_dict()})
    (data,) = source.glob("*.distcp")
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    error = refused(source, E.TensorSpecError)
    assert f"{data.name}: truncated" in str(error) and f"found {size // 2}" in str(error)


def test_an_oversized_metadata_is_refused_before_it_is_read(tmp_path: Path) -> None:
    source = saved(tmp_path / "dcp", {"model": plain_model().state_dict()})
    with open(source / ".metadata", "r+b") as f:
        f.truncate(MAX_METADATA_BYTES + 1)  # sparse: nothing written
    error = refused(source, E.SizeLimitError)
    assert ".metadata" in str(error) and str(MAX_METADATA_BYTES + 1) in str(error)


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        (b"\x80\x02])R.", "list called with tuple"),
        (b"\x80\x02}" + b"]" + b"\x85" * 100_000 + b"K\x01s.", "found tuple"),  # a deep key: never hashed
        (b"\x80\x02h\x05.", "get 5"),  # a memo entry never put
        (b"\x80\x02K\x01K\x02.", "2 values"),
        (b"\x80\x02cos\nsystem\n.", "os.system"),
        (b"\x80\x02(i__main__\nX\n.", "opcode INST"),
        (b"\x80\x02K\x01", "STOP"),
    ],
)
def test_the_machine_builds_nothing_it_was_not_told_to(raw: bytes, found: str) -> None:
    with pytest.raises(E.ManifestError, match="found") as info:
        read_pickle(raw, frozenset(), where="x", what="nothing", error=E.ManifestError)
    assert found in str(info.value) and "\n" not in str(info.value)


# -- FSDP2: the same files, sharded ---------------------------------------------------------------------


def _fsdp_rank(rank: int, port: int, export: str, out: str) -> None:
    """One of two FSDP2 ranks on the CPU: load the export into a sharded model and optimizer,
    gather its full weights, and save a sharded DCP of its own."""
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(123)
    model = DigitsNet(CHANNELS, HIDDEN)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Conv2d):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=export)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    full, _ = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        np.savez(Path(out) / "full.npz", **{k: to_numpy(v) for k, v in full.items()})
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=Path(out) / "sharded")
    torch.distributed.barrier()  # neither rank tears the group down while the other still uses it
    torch.distributed.destroy_process_group()


def test_fsdp2_loads_the_export_and_its_sharded_save_imports(trained: TrainState, tmp_path: Path) -> None:
    """Two FSDP2 ranks load the export (resharded by DCP) and hold the checkpoint's weights; their
    own save (two chunks a tensor) is imported by ``init_from.dcp`` with those weights."""
    export_dcp(trained, load_trainer(digits_config()), tmp_path / "out")
    mp.spawn(_fsdp_rank, args=(free_port(), str(tmp_path / "out"), str(tmp_path)), nprocs=2)
    full = np.load(tmp_path / "full.npz")
    for key in full.files:
        name = f"param/{key}" if f"param/{key}" in trained.tensors else f"buffer/{key}"
        assert full[key].tobytes() == trained.tensors[name].tobytes(), key
    state = imported(tmp_path / "sharded")
    weights = {n: a for n, a in trained.tensors.items() if n.startswith(("param/", "buffer/"))}
    assert all(state.tensors[n].tobytes() == a.tobytes() for n, a in weights.items())
