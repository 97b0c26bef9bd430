"""The ``--numerics`` option of the commands that compute (train, eval, worker, drill)."""

from __future__ import annotations

import argparse
import os

from cairn.numerics import DEFAULT_PROFILE, ENV, NAMES

__all__ = ["add_numerics_arg"]


def add_numerics_arg(p: argparse.ArgumentParser, what: str = "computes") -> None:
    p.add_argument(
        "--numerics",
        choices=NAMES,
        default=os.environ.get(ENV) or DEFAULT_PROFILE,
        metavar="PROFILE",
        help=f"numerics profile this process {what} under: {', '.join(NAMES)} (env {ENV}; default "
        f"{DEFAULT_PROFILE}): the same profile gives the same bits on any machine that can run it",
    )
