"""The arguments the ``cairn`` commands share: the parser class and its usage errors, the
options every command has, and the argument types (counts, run ids, stores, ``--numerics``)."""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Callable
from importlib import metadata
from typing import NoReturn

from cairn.checkpoint import RUN_ID_PATTERN
from cairn.errors import ConfigError, StoreNotFoundError
from cairn.numerics import DEFAULT_PROFILE, ENV, NAMES
from cairn.stores import Store, open_store

__all__ = [
    "CairnArgumentParser",
    "Common",
    "UsageError",
    "add_numerics_arg",
    "add_set_arg",
    "common_options",
    "count",
    "global_options",
    "run_id_arg",
    "store_arg",
]

Common = Callable[[argparse.ArgumentParser], None]
"""What each command group's ``register`` is given to add the options every command has."""


class CairnArgumentParser(argparse.ArgumentParser):
    """Usage errors become a ``UsageError``: one line, exit 2, and a JSON object with --json; a
    mistyped choice (a command, a subcommand, an option's value) gets the closest ones offered."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}{did_you_mean(message)}")


_INVALID_CHOICE = re.compile(r"invalid choice: '?(?P<word>[^',]*)'? \(choose from (?P<choices>.*)\)")


def did_you_mean(message: str) -> str:
    """``; did you mean 'train'?`` for argparse's invalid-choice message, else nothing."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return ""
    choices = [c.strip().strip("'") for c in found["choices"].split(",")]  # quoted (3.11) or not (3.12+)
    close = difflib.get_close_matches(found["word"], choices, n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


class UsageError(ConfigError):
    """The command line itself is wrong (an unknown flag, a missing or malformed argument)."""


GLOBAL_FLAGS = {"--json": "print one JSON object on stdout", "--debug": "show tracebacks"}
"""Flags every command has, accepted before the command too (``cairn --json ckpt list S``)."""


def version() -> str:
    try:
        return metadata.version("cairn-train")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


def global_options(p: argparse.ArgumentParser) -> None:
    """The top-level parser's own options: ``--version`` and the global flags (their defaults
    live here; a command's copy of a flag only sets it when given, see ``common_options``)."""
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    for flag, help_text in GLOBAL_FLAGS.items():
        p.add_argument(flag, action="store_true", help=f"{help_text} (before or after the command)")


def common_options(p: argparse.ArgumentParser) -> None:
    for flag, help_text in GLOBAL_FLAGS.items():
        # SUPPRESS: left unset unless given here, so a flag given before the command survives
        # (argparse copies every attribute a subparser sets over the parent's).
        p.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=help_text)
    p.add_argument(
        "--endpoint-url",
        help="S3 endpoint for s3:// stores (same as AWS_ENDPOINT_URL_S3; else boto3's chain)",
    )


def count(text: str) -> int:
    """An integer argument in ASCII digits (``int()`` would also take other scripts' digits)."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, found {text!r}")
    return int(text)


def run_id_arg(value: str | None, flag: str) -> str | None:
    if value is not None and not RUN_ID_PATTERN.match(value):
        raise ConfigError(flag, expected=f"a run id matching {RUN_ID_PATTERN.pattern}", found=value)
    return value


def store_arg(url: str, *, must_exist: bool) -> Store:
    """Open a store named on the command line; reading commands refuse one that does not exist."""
    expected = "a directory path or s3://bucket/prefix"
    if not url or not url.strip():
        raise ConfigError("--store", expected=expected, found=url)
    if "://" in url and not url.startswith(("s3://", "file://", "memory://")):
        raise ConfigError("store", expected=expected, found=f"{url} (unsupported scheme)")
    store = open_store(url)
    if must_exist and not store.root_exists():
        raise StoreNotFoundError(
            "store", expected="an existing store (a directory, or a bucket and prefix written by cairn)", found=url
        )
    return store


def add_numerics_arg(p: argparse.ArgumentParser, what: str = "computes") -> None:
    """The ``--numerics`` option of the commands that compute (train, eval, worker, drill)."""
    p.add_argument(
        "--numerics",
        choices=NAMES,
        default=os.environ.get(ENV) or DEFAULT_PROFILE,
        metavar="PROFILE",
        help=f"numerics profile this process {what} under: {', '.join(NAMES)} (env {ENV}; default "
        f"{DEFAULT_PROFILE}): the same profile gives the same bits on any machine that can run it",
    )


def add_set_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--set a.b.c=VALUE`` (repeatable): one field of ``what`` overridden (``cairn.config_files``)."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"override one field of {what} (repeatable; a.b.c=VALUE, VALUE typed by the field: "
        "checkpoint.every=10, config.optimizer.lr=3e-4)",
    )
