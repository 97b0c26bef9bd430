# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Export to the ecosystem: ``cairn ckpt export --format safetensors`` of a ~50M-parameter
Hugging Face GPT-2 (built from its config by ``cairn.trainers.hf``) vs ``save_pretrained``, in
the same run.

Ours streams the checkpoint's blocks from the store (every checksum verified) through one
8 MiB buffer into the files, from the device (the store's pages evicted first). Theirs twice:
``save_pretrained`` of the live model from memory (a lower bound: no checkpoint is read), and
what a user without the export does: restore the checkpoint (``load_training``, validated) into
the model, then ``save_pretrained``. All fsync their files. Seconds: median (min-max) of N interleaved
reps. Peak RSS: one of each in a fresh process, above that process's RSS once the model is
built (the export builds the run's trainer to learn the names and config; ``save_pretrained``
needs the model), vs the weights' bytes. Rendered by ``bench.sections.interop``.
Run: ``python -m bench.suites.interop [--reps 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.floor import fsync_tree
from bench.harness.machine import machine
from bench.harness.measure import drop_cache, interleaved, peak_rss, stats
from bench.harness.results import REPO, write_result
from bench.harness.states import UNSIGNED
from cairn.checkpoint import CheckpointKind, CheckpointRef, read_manifest
from cairn.config import TrainConfig, parse_config
from cairn.interop.export import export_checkpoint
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.training import load_training, save_training

MODEL = {"model_type": "gpt2", "n_layer": 14, "n_embd": 512, "n_head": 8, "n_positions": 1024}
QUICK_MODEL = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 256}


def corpus() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted(root.glob("*.py"))[:200]]


def config(quick: bool) -> TrainConfig:
    options = {
        "model": QUICK_MODEL if quick else MODEL,
        "vocab_size": 1024 if quick else 8192,
        "corpus": corpus(),
        "corpus_bytes": 300_000 if quick else 2_000_000,
        "context": 64,
    }
    return parse_config(
        {"seed": 1, "batch_size": 8, "trainer": {"factory": "cairn.trainers.hf:HFCausalLM", "options": options}}
    )


def restore_and_save(store: LocalStore, ref: CheckpointRef, trainer: Any, out: Path) -> None:
    state, _ = load_training(store, ref, run_config=trainer.config, options=UNSIGNED)
    trainer.load_state(state)
    trainer.model.save_pretrained(out)
    fsync_tree(out)


def rss_child(op: str, store_dir: str, ref_text: str, out_dir: str, quick: bool) -> None:
    """One export or ``save_pretrained`` in this (fresh) process; prints its peak RSS."""
    trainer = load_trainer(config(quick))
    store = LocalStore(store_dir)
    ref = CheckpointRef.parse(ref_text)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=UNSIGNED)
    with peak_rss() as rss:
        if op == "export":
            export_checkpoint(store, ref, manifest, trainer, Path(out_dir))
        elif op == "restore":
            restore_and_save(store, ref, trainer, Path(out_dir))
        else:
            trainer.model.save_pretrained(out_dir)  # type: ignore[attr-defined]
    print(json.dumps(rss))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rss", nargs=4, metavar=("OP", "STORE", "REF", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss:
        rss_child(*args.rss, args.quick)
        return 0
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-interop-"))
    try:
        cfg = config(args.quick)
        trainer = load_trainer(cfg)
        state = trainer.init_state()
        store = LocalStore(work / "store")
        ref = save_training(store, "hf", state, options=UNSIGNED).ref
        manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=UNSIGNED)
        names, _ = trainer.exchange_names()
        weight_bytes = sum(state.tensors[n].nbytes for n in names.values())
        params = sum(state.tensors[n].size for n in names.values())
        outs = {
            "cairn export": work / "export",
            "save_pretrained (live model)": work / "pretrained",
            "load_training + save_pretrained": work / "restored",
        }

        def before(name: str) -> None:
            shutil.rmtree(outs[name], ignore_errors=True)
            drop_cache(work / "store")

        def pretrained() -> None:
            trainer.model.save_pretrained(outs["save_pretrained (live model)"])  # type: ignore[attr-defined]
            fsync_tree(outs["save_pretrained (live model)"])

        cases = {
            "cairn export": lambda: export_checkpoint(store, ref, manifest, trainer, outs["cairn export"]),
            "save_pretrained (live model)": pretrained,
            "load_training + save_pretrained": lambda: restore_and_save(
                store, ref, trainer, outs["load_training + save_pretrained"]
            ),
        }
        times = interleaved(cases, args.reps, before)
        rss: dict[str, Any] = {}
        for op, name in (
            ("export", "cairn export"),
            ("live", "save_pretrained (live model)"),
            ("restore", "load_training + save_pretrained"),
        ):
            before(name)
            argv = [sys.executable, "-m", "bench.suites.interop", "--rss", op, str(work / "store"), str(ref)]
            done = subprocess.run(
                [*argv, str(outs[name]), *(["--quick"] if args.quick else [])],
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO,
            )
            peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_extra"]
            rss[name] = {"peak_extra": peak, "ratio_to_weights": peak / weight_bytes}
        write_result(
            "interop",
            {
                "machine": machine(),
                "reps": args.reps,
                "model": {**(QUICK_MODEL if args.quick else MODEL), "params": params, "weight_bytes": weight_bytes},
                "results": {n: {"seconds": stats(t), "rss": rss[n]} for n, t in times.items()},
            },
            quick=args.quick,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
