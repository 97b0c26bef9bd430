"""``cairn eval``: a checkpoint's loss and accuracy on its validation or final test split; a
final-test evaluation is an exposure, logged in the run's store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cairn.checkpoint import CheckpointRef, record_test_exposure
from cairn.config import load_config
from cairn.errors import ConfigError
from cairn.models import load_checkpoint
from cairn.stores import open_store
from workers.cli.args import Common, add_numerics_arg
from workers.cli.output import emit

__all__ = ["cmd_eval", "register"]


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on its validation or final test split")
    common(p)
    p.add_argument("checkpoint")
    p.add_argument("--split", choices=["val", "test"], default="val")
    p.add_argument("--config", help="the run's config: builds the trainer; the checkpoint must match it")
    add_numerics_arg(p, "evaluates")
    p.set_defaults(handler=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint on a held-out split; a test-split evaluation is an exposure, logged."""
    ref = CheckpointRef.parse(args.checkpoint)
    given = load_config(args.config) if args.config else None
    loaded = load_checkpoint(ref, given, on_host=False)  # from --config when given: the checkpoint must match it
    state, manifest, trainer = loaded.state, loaded.manifest, loaded.trainer
    store = open_store(ref.store_url)
    metrics = trainer.evaluate(state, args.split)
    if metrics is None:
        raise ConfigError(
            "--split", expected=f"a split this run holds out ({trainer.split_hint(args.split)})", found=args.split
        )
    payload: dict[str, Any] = {"checkpoint": str(ref), "split": args.split, "step": state.step, **metrics}
    shown = [f"loss {metrics['loss']:.6f}", *(f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if k != "loss")]
    text = f"{args.split} at step {state.step}: {', '.join(shown)}"
    if args.split == "test":
        count = record_test_exposure(store, ref, manifest.fingerprint, metrics, state.lineage)
        payload["final_test_exposures"] = count
        text += f"\nfinal-test exposures of this lineage: {count} (logged in {store.url}/{ref.run_id}/lifecycle/)"
        if count >= 2:
            payload["warning"] = "the final test split has been evaluated more than once"
            print(
                f"warning: the final test split has now been evaluated {count} times in this lineage; "
                "its score is no longer an unbiased estimate",
                file=sys.stderr,
            )
    emit(args, payload, text)
    return 0
