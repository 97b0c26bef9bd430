"""``cairn ckpt copy``: a checkpoint into another store, standalone (``cairn.checkpoint.copy``):
every byte it references in earlier checkpoints of an incremental run is copied, each block's
checksum verified on the way, under the same fingerprint."""

from __future__ import annotations

import argparse
from typing import Any

from cairn.checkpoint import CheckpointOptions, CheckpointRef, copy_checkpoint
from cairn.stores import open_store
from workers.cli.args import store_arg
from workers.cli.output import emit

__all__ = ["add_copy_parser", "cmd_ckpt_copy"]


def add_copy_parser(ckpt_sub: Any, common: Any) -> None:
    p = ckpt_sub.add_parser(
        "copy", help="copy a checkpoint into another store, standalone (referenced blocks copied too)"
    )
    common(p)
    p.add_argument("checkpoint")
    p.add_argument("store", help="the destination store (a directory or s3://bucket/prefix)")
    p.set_defaults(handler=cmd_ckpt_copy)


def cmd_ckpt_copy(args: argparse.Namespace) -> int:
    ref = CheckpointRef.parse(args.checkpoint)
    dest = store_arg(args.store, must_exist=False)
    result = copy_checkpoint(open_store(ref.store_url), ref, dest, options=CheckpointOptions.from_env())
    what = "copied" if result.created else "already there (identical)"
    emit(
        args,
        {
            "checkpoint": str(ref),
            "copy": str(result.ref),
            "created": result.created,
            "fingerprint": result.manifest.fingerprint,
            "bytes": result.manifest.total_bytes,
        },
        f"{what}: {result.ref} ({result.manifest.total_bytes} bytes, standalone; fingerprint "
        f"{result.manifest.fingerprint[:19]}...)",
    )
    return 0
