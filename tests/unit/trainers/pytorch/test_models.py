"""Models people train, through the PyTorch adapter: a GPT-style language model (examples/lm.py)
with bf16 weights or bf16 autocast, clipping, accumulation and a resumable stream; fp16 loss
scaling; ReduceLROnPlateau; evaluation for any output shape. Each resumes bit for bit (17 + 23
== 40) and each refusal is typed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from cairn import errors as E
from cairn.checkpoint import latest_committed
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.session import TrainingSession
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch import TorchSetup, TorchTrainer
from cairn.trainers.pytorch.evaluation import IGNORE_INDEX, default_loss, default_metrics
from examples.lm import ByteLM
from tests.conftest import REPO, seed_fixture, write_broken

TINY_LM = {"context": 16, "width": 16, "heads": 2, "layers": 1, "corpus_bytes": 8000, "eval_every": 10}


def lm_config(**options: Any) -> TrainConfig:
    """The shipped LM example (stream, accumulation 4, bf16 autocast, clipping), made tiny."""
    body = json.loads((REPO / "examples" / "lm.json").read_text())
    body["batch_size"] = 8
    body["trainer"]["options"].update({**TINY_LM, **options})
    body["trainer"]["options"] = {k: v for k, v in body["trainer"]["options"].items() if v is not None}
    return parse_config(body)


def test_bf16_weights_and_moments_resume_bit_exact_stored_in_two_bytes(tmp_path: Path) -> None:
    config = lm_config(param_dtype="bfloat16", autocast=None, streaming=False)
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert resumed.state.tensors["param/tok.weight"].dtype.name == "bfloat16"
    ref = latest_committed(resumed.store, "run")
    assert ref is not None
    manifest = read_manifest(resumed.store, ref, expect_kind=None)
    dtypes = {t.name: t.dtype for t in manifest.tensors}
    assert dtypes["param/tok.weight"] == dtypes["optim/tok.weight/exp_avg_sq"] == "bfloat16"
    entry = next(t for t in manifest.tensors if t.name == "param/tok.weight")
    assert entry.length == 2 * math.prod(entry.shape)  # never widened
    # the comparison can fail: weights alone diverge at the very next update
    at17 = TrainingSession.fresh("w", tmp_path / "w", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w2", config=config, weights_only_restore=True)
    weights.run(23, checkpoint_at_end=False)
    assert {"param.tok.weight", "cursor"} <= {d.field for d in compare_states(weights.state, straight.state)}


def test_lm_with_clipping_accumulation_autocast_and_a_stream_resumes_bit_exact(tmp_path: Path) -> None:
    config = lm_config()
    options = config.trainer.options if config.trainer else {}
    assert options["accumulation"] == 4 and options["autocast"] == "bfloat16" and options["streaming"]
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    history = straight.state.history
    assert history["val_step"] == [10.0, 20.0, 30.0, 40.0]
    assert all(0.0 <= a <= 1.0 for a in history["val_accuracy"])
    assert history["val_perplexity"] == pytest.approx([math.exp(v) for v in history["val_loss"]], rel=1e-12)


class RecordingLM(ByteLM):
    """Records every training batch it sees (the sample order, not only the loss)."""

    seen: ClassVar[list[bytes]] = []

    def compute_loss(self, x: Any, y: Any) -> torch.Tensor:
        RecordingLM.seen.append(x.numpy().tobytes())
        return super().compute_loss(x, y)


def test_a_resumed_stream_continues_the_exact_sample_order_across_passes(tmp_path: Path) -> None:
    config = lm_config(accumulation=1, autocast=None)
    config = config.model_copy(
        update={"trainer": config.trainer.model_copy(update={"factory": f"{__name__}:RecordingLM"})}
    )  # type: ignore[union-attr]
    trainer = load_trainer(config)
    assert trainer.steps_per_epoch < 70  # the runs below cross a pass of the stream
    RecordingLM.seen.clear()
    TrainingSession.fresh("ref", tmp_path / "ref", config).run(70, checkpoint_at_end=False)
    reference = list(RecordingLM.seen)
    RecordingLM.seen.clear()
    at = TrainingSession.fresh("run", tmp_path / "run", config).run(trainer.steps_per_epoch - 3)
    assert at is not None
    TrainingSession.from_checkpoint(at.ref, config=config).run(70 - at.manifest.step)
    assert RecordingLM.seen == reference and len(reference) == 70
    assert len(set(reference[: trainer.steps_per_epoch])) == trainer.steps_per_epoch


def test_accumulation_in_one_process_is_the_microbatched_update(tmp_path: Path) -> None:
    """``accumulation: 4`` and ``distributed.microbatches: 4`` (W = 1) are one arithmetic."""
    accumulated = TrainingSession.fresh("a", tmp_path / "a", lm_config(streaming=False))
    accumulated.run(6, checkpoint_at_end=False)
    body = lm_config(streaming=False, accumulation=1).to_json()
    body["distributed"] = {"microbatches": 4}
    micro = TrainingSession.fresh("m", tmp_path / "m", parse_config(body))
    micro.run(6, checkpoint_at_end=False)
    for name, arr in accumulated.state.tensors.items():
        assert arr.tobytes() == micro.state.tensors[name].tobytes(), name
    plain = TrainingSession.fresh("p", tmp_path / "p", lm_config(streaming=False, accumulation=1))
    plain.run(6, checkpoint_at_end=False)  # and it is not the one-pass update
    assert plain.state.tensors["param/tok.weight"].tobytes() != accumulated.state.tensors["param/tok.weight"].tobytes()


class ClippingProbe(ByteLM):
    norms: ClassVar[list[float]] = []

    def after_backward(self, step: int) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        ClippingProbe.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


def test_after_backward_sees_the_final_gradient_and_clipping_changes_the_update(tmp_path: Path) -> None:
    def run(clip: float | None) -> TrainingSession:
        config = lm_config(streaming=False, clip_grad_norm=clip, lr=0.05)
        trainer = config.trainer.model_copy(update={"factory": f"{__name__}:ClippingProbe"})  # type: ignore[union-attr]
        session = TrainingSession.fresh("c", tmp_path / str(clip), config.model_copy(update={"trainer": trainer}))
        session.run(3, checkpoint_at_end=False)
        return session

    ClippingProbe.norms.clear()
    unclipped = run(None)
    assert len(ClippingProbe.norms) == 3 and max(ClippingProbe.norms) > 0.01
    clipped = run(0.01)
    assert clipped.state.tensors["param/tok.weight"].tobytes() != unclipped.state.tensors["param/tok.weight"].tobytes()


# -- small models for the rest -------------------------------------------------------------------


def _blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long()


class Plateau(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return TorchSetup(model=model, optimizer=opt, scheduler=sched, train=_blobs(64, 1), val=_blobs(32, 2))


class HalfScaled(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        return TorchSetup(
            model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train=_blobs(64, 1), val=_blobs(32, 2)
        )


class Regression(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Linear(4, 1)
        x, _ = _blobs(64, 1)
        y = x.sum(dim=1, keepdim=True)
        return TorchSetup(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            train=(x, y),
            val=(x[:16], y[:16]),
            loss_fn=torch.nn.functional.mse_loss,
        )


class FailingEvaluation(HalfScaled):
    evaluations_seen: ClassVar[int] = 0

    def metrics(self, output: Any, target: Any) -> dict[str, tuple[float, float]]:
        FailingEvaluation.evaluations_seen += 1
        if FailingEvaluation.evaluations_seen > 1:
            raise ValueError("a metric the user got wrong")
        return dict(default_metrics(output, target))


class OneShotStream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        yield from zip(*_blobs(64, 1), strict=True)


class PlainStream(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Linear(4, 2)
        train = DataLoader(OneShotStream(), batch_size=8) if self.options.threads == 2 else OneShotStream()
        return TorchSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train=train)


class MapLoader(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Linear(4, 2)
        data = _blobs(64, 1)
        batch = 8 if self.options.threads == 1 else 5
        return TorchSetup(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            train=DataLoader(TensorDataset(*data), batch_size=batch, shuffle=True),
        )


class PairData(MapLoader):
    def build(self) -> TorchSetup:
        setup = super().build()
        setup.train = _blobs(64, 1)
        return setup


def own(name: str, batch_size: int = 8, **options: Any) -> TrainConfig:
    return parse_config({"batch_size": batch_size, "trainer": {"factory": f"{__name__}:{name}", "options": options}})


def test_reduce_lr_on_plateau_round_trips_its_infinity_and_resumes_bit_exact(tmp_path: Path) -> None:
    config = own("Plateau", eval_every=3)
    fresh = TrainingSession.fresh("p", tmp_path / "p", config)
    at2 = fresh.run(2)  # before any evaluation: best is still infinity
    assert at2 is not None
    assert read_manifest(fresh.store, at2.ref, expect_kind=None).meta["scheduler"]["best"] == {"$float": "inf"}
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert len(set(straight.state.history["lr"])) > 1  # the plateau did reduce the learning rate


def test_fp16_autocast_with_loss_scaling_checkpoints_the_scaler(tmp_path: Path) -> None:
    config = own("HalfScaled", autocast="float16", grad_scaler=True)
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert straight.state.meta["scaler"]["scale"] == resumed.state.meta["scaler"]["scale"] > 0


def test_evaluation_of_any_output_shape() -> None:
    logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])  # B=1, T=3, V=2
    tokens = torch.tensor([[0, 0, IGNORE_INDEX]])
    assert default_metrics(logits, tokens) == {"accuracy": (1.0, 2.0)}
    assert default_metrics(logits[0], torch.tensor([0, 1, 1])) == {"accuracy": (2.0, 3.0)}  # N x C
    assert default_metrics(torch.zeros(3, 1), torch.zeros(3, 1)) == {}  # regression: loss only
    sequence_loss = default_loss(logits, tokens)
    flat = torch.nn.functional.cross_entropy(logits[0, :2], tokens[0, :2])
    assert float(sequence_loss) == pytest.approx(float(flat))


def test_a_model_without_a_default_metric_reports_loss_only_and_resumes(tmp_path: Path) -> None:
    config = own("Regression", eval_every=4)
    straight, resumed = seed_fixture(config, tmp_path)
    assert compare_states(resumed.state, straight.state) == []
    assert sorted(k for k in straight.state.history if k.startswith("val")) == ["val_loss", "val_step"]
    assert len(straight.state.history["val_loss"]) == 10
    assert straight.trainer.evaluate(straight.state, "val") == {"loss": straight.state.history["val_loss"][-1]}


def test_a_failing_evaluation_commits_what_was_trained_before_it(tmp_path: Path) -> None:
    FailingEvaluation.evaluations_seen = 0
    session = TrainingSession.fresh("e", tmp_path / "e", own("FailingEvaluation", eval_every=5))
    with pytest.raises(E.TrainerCodeError, match="a metric the user got wrong.*committed at step 9"):
        session.run(20)
    ref = latest_committed(session.store, "e")
    assert ref is not None and ref.step == 9
    FailingEvaluation.evaluations_seen = -100  # the user fixed the metric: resume from what was kept
    resumed = TrainingSession.from_checkpoint(ref, config=own("FailingEvaluation", eval_every=5))
    resumed.run(11)
    assert resumed.state.history["val_step"] == [5.0, 10.0, 15.0, 20.0]


def test_a_map_style_dataloader_is_its_dataset_under_cairns_sampler(tmp_path: Path) -> None:
    loader = TrainingSession.fresh("l", tmp_path / "l", own("MapLoader"))
    loader.run(12, checkpoint_at_end=False)
    pair = TrainingSession.fresh("l", tmp_path / "p", own("PairData"))
    pair.run(12, checkpoint_at_end=False)
    assert loader.trainer.data_hash == pair.trainer.data_hash
    for name, arr in pair.state.tensors.items():
        assert loader.state.tensors[name].tobytes() == arr.tobytes(), name


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("PlainStream", {}, "IterableDataset with state_dict"),
        ("PlainStream", {"threads": 2}, "StatefulDataLoader"),
        ("MapLoader", {"threads": 2}, "DataLoader.batch_size: expected 8, found 5"),
        ("HalfScaled", {"grad_scaler": True}, "loss scaling is for float16 autocast"),
        ("HalfScaled", {"accumulation": 16}, "a multiple of the 16 micro-steps"),
    ],
)
def test_setups_the_adapter_cannot_resume_are_refused_at_build(
    name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(E.ConfigError, match=message):
        load_trainer(own(name, **options))


def test_plateau_without_a_val_split_is_refused() -> None:
    class NoVal(Plateau):
        def build(self) -> TorchSetup:
            setup = super().build()
            setup.val = None
            return setup

    globals()["NoVal"] = NoVal
    with pytest.raises(E.ConfigError, match="ReduceLROnPlateau steps on the validation loss"):
        load_trainer(own("NoVal"))


def test_a_wrong_half_dtype_and_a_foreign_stream_state_are_refused(tmp_path: Path) -> None:
    config = lm_config(param_dtype="bfloat16", autocast=None)
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    session.run(3)
    before = session.state.copy()

    def as_fp16(arrays: dict[str, np.ndarray]) -> None:
        arrays["param/ln.weight"] = arrays["param/ln.weight"].astype(np.float32).astype(np.float16)

    ref = write_broken(session.store, "fp16", session.state.copy(), tensors=as_fp16)
    with pytest.raises(E.TensorSpecError) as info:
        session.restore(ref)
    assert (info.value.field, info.value.expected, info.value.found) == (
        "tensors[param/ln.weight].dtype",
        "bfloat16",
        "<f2",
    )
    forged = session.state.copy()
    forged.meta["data"]["stream"]["dataset_state"] = {"offset": 3}
    ref = write_broken(session.store, "stream", forged)
    with pytest.raises(E.InvariantError) as info2:
        session.restore(ref)
    assert info2.value.field == "meta.data.stream.dataset_state"
    forged = session.state.copy()
    forged.meta["data"]["batches"] = 2
    with pytest.raises(E.InvariantError, match="one batch per update"):
        session.restore(write_broken(session.store, "batches", forged))
    assert compare_states(session.state, before) == []


def test_the_shipped_lm_example_and_its_run_input_validate() -> None:
    from activities.inputs import TrainingRunInput

    inp = TrainingRunInput.model_validate_json((REPO / "examples" / "lm-run.json").read_text())
    assert inp.config == parse_config(json.loads((REPO / "examples" / "lm.json").read_text()))
    trainer = load_trainer(inp.config)
    assert trainer.eval_history and trainer.steps_per_epoch > 0


def test_a_checkpoint_written_before_meta_eval_still_restores(tmp_path: Path) -> None:
    """Checkpoints of earlier releases have no ``meta.eval``: they recorded accuracy."""
    from tests.conftest import digits_config

    config = digits_config(val_fraction=0.45, test_fraction=0.45)
    session = TrainingSession.fresh("old", tmp_path / "s", config)
    session.run(session.trainer.steps_per_epoch + 1)
    assert session.state.meta["eval"] == {"metrics": ["accuracy"]}
    older = session.state.copy()
    del older.meta["eval"]
    ref = write_broken(session.store, "older", older)
    restored = TrainingSession.from_checkpoint(ref, config=config)
    assert compare_states(restored.state, older) == []
    restored.run(1)  # and it trains on, recording the metrics it always had
    assert restored.state.meta["eval"] == {"metrics": ["accuracy"]}


class NaNMetric(HalfScaled):
    def metrics(self, output: Any, target: Any) -> dict[str, tuple[float, float]]:
        return {"accuracy": (float("nan"), 1.0)}


class BrokenStream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.i = 0

    def __iter__(self) -> Any:
        while True:
            self.i += 1
            if self.i > 20:
                raise OSError("the shard on the network disk went away")
            yield torch.randn(4), torch.tensor(self.i % 2)

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class BrokenStreamTrainer(TorchTrainer):
    def build(self) -> TorchSetup:
        model = torch.nn.Linear(4, 2)
        return TorchSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train=BrokenStream())


def test_a_non_finite_evaluation_is_the_trainers_error_and_never_reaches_a_checkpoint(tmp_path: Path) -> None:
    session = TrainingSession.fresh("n", tmp_path / "n", own("NaNMetric", eval_every=4))
    with pytest.raises(E.TrainerCodeError, match="accuracy not finite.*committed at step 3"):
        session.run(10)
    ref = latest_committed(session.store, "n")
    assert (
        ref is not None and TrainingSession.from_checkpoint(ref, config=own("NaNMetric", eval_every=4)).state.step == 3
    )


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_failing_stream_is_the_trainers_error_in_every_update_path(tmp_path: Path, accumulation: int) -> None:
    session = TrainingSession.fresh(
        "s", tmp_path / "s", own("BrokenStreamTrainer", accumulation=accumulation, epoch_steps=5)
    )
    with pytest.raises(E.TrainerCodeError, match="OSError: the shard on the network disk went away") as info:
        session.run(10)
    assert not info.value.retryable
