# ruff: noqa: E501  (progress lines read better unbroken)
"""Fine-tuning: what a pretrained model on files larger than memory costs to build, verify and
checkpoint.

- **Data fingerprint vs dataset size.** The fine-tuning example's config (a small pretrained Llama,
  ``examples/finetune.py``; an instruction JSONL streamed by ``trainer.options.data``) built as a
  trainer (what every segment's cold start, ``ckpt verify`` and ``ckpt export`` pay) and
  ``cairn ckpt verify`` run on a one-step checkpoint of it, for JSONL files of several sizes:
  *cold* (the file's content hash not cached yet: its bytes are read once) and *warm* (hashes
  cached by path, size, mtime: no data byte is read). The sizes are interleaved rep by rep.
- **LoRA vs a full fine-tune:** bytes written per checkpoint with incremental checkpoints (the
  frozen base's blocks written once, then referenced), rank 8.
- **Loader throughput:** sequences per second of the streamed loader with 0 and 2 worker processes
  (the same batches, bit for bit), and from the same records in Parquet (row groups of 10,000
  records, 0 workers: a row group decoded once for all the shuffle blocks read from it), interleaved.

Rendered by ``bench.sections.finetune``.
Run: ``python -m bench.suites.finetune [--sizes-mib 1,16,128,1024] [--reps 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import interleaved, stats
from bench.harness.results import write_result

LORA = {"r": 8, "alpha": 16}


def write_jsonl(path: Path, mib: int) -> int:
    """Instruction records up to ``mib`` MiB; the records written."""
    record, n, size = 0, 0, mib << 20
    with path.open("w") as out:
        while out.tell() < size:
            lines = []
            for _ in range(1000):
                a, b = record % 97, (record * 7) % 89
                lines.append(json.dumps({"prompt": f"What is {a} plus {b}? ({record})", "response": f"{a + b}."}))
                record += 1
            out.write("\n".join(lines) + "\n")
            n += 1000
    return n


def config(base: Path, data: Path, cache: Path, **options: Any) -> Any:
    from cairn.config import parse_config

    body = {
        "pretrained": str(base),
        "data": {"files": [str(data)], "records": "instruction", "context": 64, "hash_cache": str(cache)},
        "epoch_steps": 50,
        **options,
    }
    return parse_config(
        {"seed": 7, "batch_size": 8, "trainer": {"factory": "cairn.trainers.hf:HFCausalLM", "options": body}}
    )


def fingerprint(work: Path, base: Path, sizes: list[int], reps: int) -> dict[str, Any]:
    from cairn.session import TrainingSession
    from cairn.trainers.loading import load_trainer
    from workers.cli.main import main as cairn

    files = {mib: work / f"data-{mib}.jsonl" for mib in sizes}
    records = {mib: write_jsonl(path, mib) for mib, path in files.items()}
    refs, configs = {}, {}
    for mib, path in files.items():
        cfg = config(base, path, work / f"warm-cache-{mib}")
        configs[mib] = work / f"config-{mib}.json"
        configs[mib].write_text(json.dumps(cfg.to_json()))
        committed = TrainingSession.fresh(f"fp{mib}", work / "store", cfg).run(1)
        assert committed is not None
        refs[mib] = str(committed.ref)
    cold_n = [0]

    def cold(mib: int) -> None:
        cold_n[0] += 1  # a fresh cache: the file's bytes are hashed
        load_trainer(config(base, files[mib], work / f"cold-cache-{mib}-{cold_n[0]}"))

    cases: dict[str, Any] = {}
    for mib in sizes:
        cases[f"build_cold_{mib}"] = lambda m=mib: cold(m)
        cases[f"build_warm_{mib}"] = lambda m=mib: load_trainer(config(base, files[m], work / f"warm-cache-{m}"))
        cases[f"verify_warm_{mib}"] = lambda m=mib: cairn(["ckpt", "verify", refs[m], "--config", str(configs[m])])
    times = interleaved(cases, reps)
    return {
        "sizes_mib": sizes,
        "records": {str(m): records[m] for m in sizes},
        "bytes": {str(m): files[m].stat().st_size for m in sizes},
        **{name: stats(t) for name, t in times.items()},
    }


def lora_bytes(work: Path, base: Path, data: Path) -> dict[str, Any]:
    from cairn.checkpoint import CheckpointOptions, read_manifest, referenced_of
    from cairn.session import TrainingSession
    from cairn.stores import LocalStore

    out: dict[str, Any] = {}
    for name, options in (("lora", {"lora": LORA}), ("full", {})):
        store = LocalStore(work / f"store-{name}")
        session = TrainingSession.fresh(
            name, store, config(base, data, work / "cache", **options), options=CheckpointOptions(incremental=True)
        )
        written = []
        for _ in range(4):
            committed = session.run(5)
            assert committed is not None
            written.append(referenced_of(read_manifest(store, committed.ref, expect_kind=None)).written_bytes)
        out[name] = {"first": written[0], "later": stats([float(w) for w in written[1:]])}
    return out


def loader(work: Path, base: Path, mib: int, reps: int, batches: int) -> dict[str, Any]:
    """Two JSONL files of ``mib`` MiB (two shards: a lane each, a worker each), and their records
    as two Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cairn.trainers.hf.pretrained import read_pretrained
    from cairn.trainers.pytorch.records import DataFiles, RecordLoader

    tokenizer = read_pretrained(str(base)).tokenizer
    files = [work / f"loader-{i}.jsonl" for i in range(2)]
    for path in files:
        write_jsonl(path, mib)
    parquet = [path.with_suffix(".parquet") for path in files]
    for path, out in zip(files, parquet, strict=True):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=10_000)
    loaders = {}
    for name, paths, workers in (("workers_0", files, 0), ("workers_2", files, 2), ("parquet_workers_0", parquet, 0)):
        options = DataFiles(
            files=[str(path) for path in paths],
            records="instruction",
            context=64,
            lanes=2,
            num_workers=workers,
            hash_cache=str(work / "cache"),
        )
        loaders[name] = RecordLoader(options, tokenizer, 8, 7)

    def draw(name: str) -> None:
        it = iter(loaders[name])
        for _ in range(batches):
            next(it)

    times = interleaved({name: (lambda n=name: draw(n)) for name in loaders}, reps)
    return {"batches": batches, "batch_size": 8, "files_mib": mib, **{name: stats(t) for name, t in times.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="1,16,128,1024")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB, 2 reps: a smoke run")
    args = parser.parse_args()
    sizes, reps = ([1, 4], 2) if args.quick else ([int(s) for s in args.sizes_mib.split(",")], args.reps)
    from examples.finetune import save_base

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cairn-bench-ft-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("XDG_CACHE_HOME", str(work / "xdg-cache"))  # never the user's cache
        base = save_base(work / "base")
        fp = fingerprint(work, base, sizes, reps)
        for mib in sizes:
            print(
                f"{mib} MiB: build cold {fp[f'build_cold_{mib}']['median']:.2f}s warm {fp[f'build_warm_{mib}']['median']:.2f}s, "
                f"verify warm {fp[f'verify_warm_{mib}']['median']:.2f}s",
                flush=True,
            )
        small = work / f"data-{sizes[0]}.jsonl"
        lb = lora_bytes(work, base, small)
        print(
            f"bytes per checkpoint after the first: LoRA {lb['lora']['later']['median']:.0f}, full {lb['full']['later']['median']:.0f}",
            flush=True,
        )
        ld = loader(work, base, sizes[0], reps, 20 if args.quick else 200)
        print(
            f"loader: 0 workers {ld['workers_0']['median']:.2f}s, 2 workers {ld['workers_2']['median']:.2f}s, "
            f"Parquet (0 workers) {ld['parquet_workers_0']['median']:.2f}s",
            flush=True,
        )
    payload = {
        "machine": machine(),
        "reps": reps,
        "fingerprint": fp,
        "lora": lb,
        "loader": ld,
        "seconds": time.perf_counter() - started,
    }
    write_result("finetune", payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
