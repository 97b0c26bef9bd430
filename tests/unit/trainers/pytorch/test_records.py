"""Files larger than memory as a resumable stream (``cairn.trainers.pytorch.records``): the
sample order after a resume is the uninterrupted one across epochs and shuffling, with or
without loader workers; packing keeps document boundaries; chat and instruction prompts are
masked; a Parquet row group is decoded once for all the blocks read from it; the files are
identified at O(files) cost and a changed or corrupt file is refused in one typed line naming
the option's path in the run's config. A test-local trainer on a streamed JSONL file resumes bit
for bit (17 + 23 == 40), and a changed file refuses its resume naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from cairn import errors as E
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig, parse_config
from cairn.session import TrainingSession
from cairn.trainers.loading import load_trainer
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer
from cairn.trainers.pytorch.records import DataFile, DataFiles, RecordLoader
from tests.conftest import seed_fixture

EOS = "<|endoftext|>"
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "log", "red", "blue", "quick", "slow"]


def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(WORDS * 4)], trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return make_tokenizer()


def sentences(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 14)))) for _ in range(n)]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def write_corpus(root: Path) -> list[str]:
    """Two JSONL files, a Parquet file of three row groups and a text file: seven shards."""
    root.mkdir(parents=True, exist_ok=True)
    write_jsonl(root / "a.jsonl", sentences(1, 12))
    write_jsonl(root / "b.jsonl", sentences(2, 9))
    table = pa.table({"text": sentences(3, 15)})
    pq.write_table(table, root / "c.parquet", row_group_size=5)
    (root / "d.txt").write_text("\n\n".join(sentences(4, 8)) + "\n")
    return [str(root / "*.jsonl"), str(root / "c.parquet"), str(root / "d.txt")]


def options(root: Path, **kw: Any) -> DataFiles:
    base: dict[str, Any] = {"files": write_corpus(root), "context": 8, "lanes": 2, "shuffle_buffer": 4}
    base["hash_cache"] = str(root.parent / "cache")
    return DataFiles(**{**base, **kw})


def draw(loader: RecordLoader, n: int) -> list[bytes]:
    out = []
    for x, y in loader:
        out.append(x.numpy().tobytes() + y.numpy().tobytes())
        if len(out) == n:
            return out
    raise AssertionError("the stream ended")


def epochs(state: dict[str, Any]) -> set[int]:
    """The epochs the lanes are in (a loader without workers)."""
    lanes = state["loader"]["dataset_state"]["lanes"]
    return {lane["epoch"] for lane in lanes.values()}


def test_a_resume_mid_epoch_and_across_epochs_continues_the_uninterrupted_order(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    o = options(tmp_path / "data")
    straight = RecordLoader(o, tokenizer, batch_size=3, seed=7)
    reference = draw(straight, 60)
    assert max(epochs(straight.state_dict())) >= 2  # the run crosses epoch boundaries
    for cut in (5, 23, 41):
        first = RecordLoader(o, tokenizer, batch_size=3, seed=7)
        head = draw(first, cut)
        state = json.loads(json.dumps(first.state_dict()))  # plain JSON, as the cursor holds it
        resumed = RecordLoader(o, tokenizer, batch_size=3, seed=7)
        resumed.load_state_dict(state)
        assert head + draw(resumed, 60 - cut) == reference, cut
    # fail-first: the same loader without the state starts over, and the order differs
    fresh = RecordLoader(o, tokenizer, batch_size=3, seed=7)
    assert reference[:23] + draw(fresh, 37) != reference
    # the order is shuffled (another seed, another order) and is not file order
    assert draw(RecordLoader(o, tokenizer, batch_size=3, seed=8), 20) != reference[:20]
    unshuffled = draw(RecordLoader(o.model_copy(update={"shuffle": False}), tokenizer, 3, 7), 20)
    assert unshuffled != reference[:20]


def test_the_state_is_positions_not_data(tokenizer: Tokenizer, tmp_path: Path) -> None:
    loader = RecordLoader(options(tmp_path / "data", shuffle_buffer=64), tokenizer, batch_size=3, seed=7)
    draw(loader, 10)
    lanes = loader.state_dict()["loader"]["dataset_state"]["lanes"]
    assert set(lanes["0"]) == {"epoch", "shard", "record", "offset", "token", "block", "taken"}
    assert len(json.dumps(loader.state_dict())) < 2000


def test_two_workers_give_the_same_batches_as_none_and_resume(tokenizer: Tokenizer, tmp_path: Path) -> None:
    o = options(tmp_path / "data", lanes=2)
    reference = draw(RecordLoader(o, tokenizer, batch_size=3, seed=7), 30)
    w = o.model_copy(update={"num_workers": 2})
    assert draw(RecordLoader(w, tokenizer, batch_size=3, seed=7), 30) == reference
    first = RecordLoader(w, tokenizer, batch_size=3, seed=7)
    head = draw(first, 11)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = RecordLoader(w, tokenizer, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    assert head + draw(resumed, 19) == reference


def test_packing_keeps_every_token_in_order_with_eos_between_documents(tokenizer: Tokenizer, tmp_path: Path) -> None:
    texts = sentences(5, 10)
    o = DataFiles(
        files=[str(write_jsonl(tmp_path / "a.jsonl", texts))],
        context=6,
        shuffle=False,
        hash_cache=str(tmp_path / "cache"),
    )
    loader = RecordLoader(o, tokenizer, batch_size=2, seed=0, train=False)
    rows = [torch.cat([x, y[:, -1:]], dim=1) for x, y in loader]
    packed = torch.cat(rows).reshape(-1).tolist()  # windows of context + 1 tokens, back to back
    eos = tokenizer.token_to_id(EOS)
    stream = [t for text in texts for t in [*tokenizer.encode(text).ids, eos]]
    assert packed == stream[: len(packed)] and len(stream) - len(packed) < 7  # the last partial window dropped
    for x, y in RecordLoader(o, tokenizer, batch_size=2, seed=0, train=False):
        assert torch.equal(x[:, 1:], y[:, :-1])  # text: every next token is a target, EOS included


def test_chat_and_instruction_records_train_on_the_replies_only(tokenizer: Tokenizer, tmp_path: Path) -> None:
    chats = [
        {"messages": [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat on mat"}]},
        {"prompt": "a dog", "response": "ran under log"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps(chats[0]) + "\n")
    (tmp_path / "inst.jsonl").write_text(json.dumps(chats[1]) + "\n")
    eos = tokenizer.token_to_id(EOS)
    for name, records, reply in (("chat", "chat", "sat on mat"), ("inst", "instruction", "ran under log")):
        o = DataFiles(
            files=[str(tmp_path / f"{name}.jsonl")],
            records=records,
            context=40,
            shuffle=False,
            hash_cache=str(tmp_path / "cache"),
        )
        loader = RecordLoader(o.model_copy(update={"context": 2}), tokenizer, batch_size=1, seed=0, train=False)
        x, y = next(iter(loader))  # windows exist; now one window covering the whole document:
        ids = tokenizer.encode(reply + "\n").ids + [eos]
        dataset = RecordLoader(o, tokenizer, batch_size=1, seed=0).dataset
        lane = dataset.lanes[0]
        lane.block_size = 1
        document = next(lane._documents(lane.start))[0]
        trained = [t for t, f in zip(*document, strict=True) if f]
        assert trained == ids, name  # the reply, its newline and EOS; the prompt and headers masked
        assert not all(document[1])


def test_a_cached_fingerprint_reads_no_file_and_a_changed_file_is_refused(tokenizer: Tokenizer, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", sentences(6, 50))
    o = DataFiles(files=[str(data)], context=8, hash_cache=str(tmp_path / "cache"))
    with opened() as first:
        one = RecordLoader(o, tokenizer, batch_size=2, seed=1)
    with opened() as second:
        two = RecordLoader(o, tokenizer, batch_size=2, seed=1)
    assert first.count(str(data)) == 1 and second.count(str(data)) == 0  # the cache answered
    assert one.fingerprint() == two.fingerprint()
    draw(one, 3)
    state = json.loads(json.dumps(one.state_dict()))
    text = data.read_text()
    data.write_text(text.replace("cat", "dog", 1) if "cat" in text else text.replace("the", "red", 1))
    changed = RecordLoader(o, tokenizer, batch_size=2, seed=1)
    assert changed.fingerprint() != one.fingerprint()
    with pytest.raises(E.IncompatibleConfigError) as refused:
        changed.load_state_dict(state)
    assert str(refused.value).startswith(
        f"trainer.options.data.files[0] ({data}): changed since the checkpoint was written; nothing was loaded"
    )
    assert "\n" not in str(refused.value)


def test_a_declared_digest_is_not_read_and_a_wrong_one_is_refused(tokenizer: Tokenizer, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", sentences(6, 20))
    declared = DataFiles(files=[DataFile(path=str(data), sha256="0" * 64)], hash_cache=str(tmp_path / "c"))
    with opened() as reads:
        RecordLoader(declared, tokenizer, batch_size=2, seed=1)
    assert reads.count(str(data)) == 0
    RecordLoader(declared.model_copy(update={"files": [str(data)]}), tokenizer, 2, 1)  # now the cache knows it
    with pytest.raises(E.ConfigError, match=r"declared sha256"):
        RecordLoader(declared, tokenizer, batch_size=2, seed=1)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"text": "a cat"}\n{"text": "a dog"}\n{"text": oops\n', "line 3: expected a JSON object"),
        ("field.jsonl", '{"text": "a cat"}\n{"body": "a dog"}\n', "line 2: field 'text': expected a str"),
        ("long.jsonl", '{"text": "' + "a " * 200 + '"}\n', "line 1: expected <= 64 bytes (max_record_bytes)"),
        ("long.txt", "a cat\n" * 20, "line 1: expected a paragraph of <= 64 bytes (max_record_bytes)"),
    ],
)
def test_corrupt_json_lines_are_refused_naming_file_and_line(
    tokenizer: Tokenizer, tmp_path: Path, name: str, content: str, message: str
) -> None:
    (tmp_path / name).write_text(content)
    (tmp_path / "good.jsonl").write_text('{"text": "a cat"}\n')
    files = [str(tmp_path / "good.jsonl"), str(tmp_path / name)]
    o = DataFiles(files=files, context=4, max_record_bytes=64, shuffle=False, hash_cache=str(tmp_path / "c"))
    with pytest.raises(E.ConfigError) as refused:
        draw(RecordLoader(o, tokenizer, batch_size=1, seed=0, field="trainer.options.val_data"), 20)
    where = f"trainer.options.val_data.files[1] ({tmp_path / name}), {message}"
    assert str(refused.value).startswith(where) and "\n" not in str(refused.value)


def test_a_corrupt_file_in_a_worker_is_refused_in_one_line(tokenizer: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "a cat sat"}\n' * 5 + "{oops\n")
    (tmp_path / "b.jsonl").write_text('{"text": "a dog ran"}\n' * 5)
    o = DataFiles(files=[str(tmp_path / "*.jsonl")], context=4, lanes=2, num_workers=2, hash_cache=str(tmp_path))
    with pytest.raises(E.ConfigError) as refused:
        draw(RecordLoader(o, tokenizer, batch_size=1, seed=0), 50)
    where = f"trainer.options.data.files[0] ({tmp_path / 'a.jsonl'}), line 6"
    assert str(refused.value).startswith(f"{where}: expected a JSON object")


def test_truncated_and_foreign_parquet_files_are_refused(tokenizer: Tokenizer, tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": sentences(1, 30)}), good, row_group_size=10)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-100])
    o = DataFiles(files=[str(cut)], context=4, hash_cache=str(tmp_path / "c"))
    with pytest.raises(
        E.ConfigError, match=re.escape(f"trainer.options.data.files[0] ({cut}): expected a Parquet file")
    ):
        RecordLoader(o, tokenizer, batch_size=1, seed=0)
    wrong = DataFiles(files=[str(good)], context=4, text_field="body", hash_cache=str(tmp_path / "c"))
    with pytest.raises(E.ConfigError) as refused:
        draw(RecordLoader(wrong, tokenizer, batch_size=1, seed=0), 5)
    found = r"row group \d: expected columns \['body'\], found no column 'body'"
    assert re.match(re.escape(f"trainer.options.data.files[0] ({good}), ") + found, str(refused.value))
    small = DataFiles(files=[str(good)], context=4, max_row_group_bytes=1024, hash_cache=str(tmp_path / "c"))
    pq.write_table(pa.table({"text": ["x" * 2000] * 3}), good)
    with pytest.raises(E.ConfigError) as refused:
        draw(RecordLoader(small, tokenizer, batch_size=1, seed=0), 5)
    where = f"trainer.options.data.files[0] ({good}), row group 0: expected <= 1024 bytes (max_row_group_bytes)"
    assert str(refused.value).startswith(where)


def test_a_parquet_row_group_is_decoded_once_for_all_the_blocks_read_from_it(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.parquet"
    table = pa.table({"text": sentences(11, 60), "other": ["x" * 500] * 60})
    pq.write_table(table, path, row_group_size=30)
    o = DataFiles(files=[str(path)], context=8, lanes=1, shuffle_buffer=2, hash_cache=str(tmp_path / "c"))
    reference = draw(RecordLoader(o, tokenizer, batch_size=2, seed=3), 12)
    decoded: list[tuple[int, Any]] = []
    real = pq.ParquetFile.read_row_group

    def counted(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        decoded.append((i, kwargs.get("columns")))
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    loader = RecordLoader(o, tokenizer, batch_size=2, seed=3)
    assert draw(loader, 12) == reference  # 12 blocks of 2 sequences, within the first epoch
    assert max(epochs(loader.state_dict())) == 0 and loader.dataset.lanes[0].block >= 11
    groups = [group for group, _ in decoded]
    assert groups and len(groups) == len(set(groups)), decoded  # each row group once, not once a block
    assert all(columns == ["text"] for _, columns in decoded)  # the needed column only
    resumed = RecordLoader(o, tokenizer, batch_size=2, seed=3)
    head = RecordLoader(o, tokenizer, batch_size=2, seed=3)
    first = draw(head, 5)
    resumed.load_state_dict(json.loads(json.dumps(head.state_dict())))
    assert first + draw(resumed, 7) == reference


def test_each_refusal_names_the_option_path_in_the_run_config(tokenizer: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "a cat"}\n')
    field = "trainer.options.val_data"

    def refusal(**kw: Any) -> str:
        o = DataFiles(**{"files": [str(tmp_path / "a.jsonl")], "hash_cache": str(tmp_path / "c"), **kw})
        with pytest.raises(E.ConfigError) as refused:
            RecordLoader(o, tokenizer, batch_size=1, seed=0, field=field)
        assert "\n" not in str(refused.value)
        return str(refused.value)

    missing = str(tmp_path / "none-*.jsonl")
    assert refusal(files=[str(tmp_path / "a.jsonl"), missing]).startswith(f"{field}.files[1]: expected a file")
    assert refusal(lanes=2).startswith(f"{field}.lanes: expected <= 1 (the files' shards), found 2")
    assert refusal(template="chat_template").startswith(f"{field}.template: expected a tokenizer with a chat")
    declared = DataFile(path=str(tmp_path / "a.jsonl"), sha256="0" * 64)
    RecordLoader(DataFiles(files=[str(tmp_path / "a.jsonl")], hash_cache=str(tmp_path / "c")), tokenizer, 1, 0)
    where = f"{field}.files[0] ({tmp_path / 'a.jsonl'}): declared sha256: expected sha256:"
    assert refusal(files=[declared]).startswith(where)
    gone = tmp_path / "gone.jsonl"
    gone.write_text('{"text": "a cat"}\n')
    loader = RecordLoader(DataFiles(files=[str(gone)], hash_cache=str(tmp_path / "c")), tokenizer, 1, 0, field=field)
    gone.unlink()
    with pytest.raises(E.ConfigError) as refused:
        draw(loader, 1)
    assert str(refused.value).startswith(f"{field}.files[0] ({gone}): expected a readable file, found FileNotFound")


@contextmanager
def opened() -> Iterator[list[str]]:
    """The paths opened while inside (an audit hook: every ``open``, however it is called)."""
    seen: list[str] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


_RECORDERS: list[list[str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _RECORDERS and isinstance(args[0], str | os.PathLike):
        _RECORDERS[-1].append(os.fspath(args[0]))


sys.addaudithook(_audit)


# -- a trainer on a streamed JSONL file -----------------------------------------------------------------


class StreamedOptions(TorchOptions):
    data: DataFiles
    tokenizer: str
    width: int = 16


class StreamedLM(TorchTrainer):
    """A bigram-ish language model on ``records`` batches (a test-local trainer)."""

    Options = StreamedOptions
    options: StreamedOptions

    def build(self) -> TorchSetup:
        tokenizer = Tokenizer.from_file(self.options.tokenizer)
        vocab = tokenizer.get_vocab_size()
        model = torch.nn.Sequential(torch.nn.Embedding(vocab, self.options.width), torch.nn.Linear(16, vocab))
        data = self.options.data
        return TorchSetup(
            model=model,
            optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
            train=RecordLoader(data, tokenizer, self.config.batch_size, self.config.seed),
            val=RecordLoader(data, tokenizer, 8, self.config.seed, train=False),
        )


def streamed_config(tmp_path: Path, **data: Any) -> TrainConfig:
    tok = tmp_path / "tokenizer.json"
    make_tokenizer().save(str(tok))
    write_jsonl(tmp_path / "train-0.jsonl", sentences(9, 25))
    write_jsonl(tmp_path / "train-1.jsonl", sentences(10, 20))
    body = {"files": [str(tmp_path / "train-*.jsonl")], "context": 8, "lanes": 2, "shuffle_buffer": 4}
    body["hash_cache"] = str(tmp_path / "c")
    opts = {"data": {**body, **data}, "tokenizer": str(tok), "epoch_steps": 10, "eval_every": 20}
    trainer = {"factory": f"{__name__}:StreamedLM", "options": opts}
    return parse_config({"seed": 17, "batch_size": 4, "trainer": trainer})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_trainer_on_a_streamed_jsonl_file_resumes_bit_exact(tmp_path: Path, workers: int) -> None:
    config = streamed_config(tmp_path, num_workers=workers)
    straight, resumed = seed_fixture(config, tmp_path / "runs")
    assert compare_states(resumed.state, straight.state) == []
    if not workers:
        assert straight.state.meta["data"]["stream"]["loader"]["dataset_state"]["lanes"]["0"]["epoch"] >= 1
    at17 = TrainingSession.fresh("w", tmp_path / "w", config).run(17)
    assert at17 is not None
    weights = TrainingSession.from_checkpoint(at17.ref, run_id="w2", config=config, weights_only_restore=True)
    weights.run(23, checkpoint_at_end=False)
    assert {"param.1.weight", "cursor"} <= {d.field for d in compare_states(weights.state, straight.state)}


def test_a_changed_file_refuses_the_resume_in_one_typed_line_naming_it(tmp_path: Path) -> None:
    config = streamed_config(tmp_path)
    at5 = TrainingSession.fresh("run", tmp_path / "runs", config).run(5)
    assert at5 is not None
    data = tmp_path / "train-1.jsonl"
    then = hashlib.sha256(data.read_bytes()).hexdigest()
    data.write_text(data.read_text().replace("a", "e", 1))
    now = hashlib.sha256(data.read_bytes()).hexdigest()
    with pytest.raises(E.IncompatibleConfigError) as refused:
        TrainingSession.from_checkpoint(at5.ref, config=config)
    assert str(refused.value) == (
        f"trainer.options.data.files[0] ({data}): changed since the checkpoint was written; nothing was loaded "
        f"(expected sha256:{then[:12]}, found sha256:{now[:12]})"
    )
    (tmp_path / "train-2.jsonl").write_text('{"text": "a cat"}\n')  # the glob matches one more file
    with pytest.raises(E.IncompatibleConfigError) as refused:
        TrainingSession.from_checkpoint(at5.ref, config=config)
    assert str(refused.value) == (
        "trainer.options.data.files: the files are not the checkpoint's; nothing was loaded "
        "(expected 2 files, found 3 files)"
    )


def test_a_checkpoint_without_file_digests_is_refused_as_before(tmp_path: Path) -> None:
    """A cursor that records no digests (another loader's, or a checkpoint written before they
    were recorded), or the same ones: the data differs elsewhere, and the refusal says only that."""
    config = streamed_config(tmp_path)
    trainer: Any = load_trainer(config)
    state = trainer.init_state()
    stream = state.meta["data"]["stream"]
    for meta in ({"data": {**state.meta["data"], "stream": {"loader": stream["loader"]}}}, state.meta, {}):
        error = trainer.other_data_error("sha256:" + "0" * 64, meta)
        assert isinstance(error, E.IncompatibleConfigError)
        assert str(error).startswith("lineage.dataset_hash: checkpoint was trained on different data (expected sha256:")
