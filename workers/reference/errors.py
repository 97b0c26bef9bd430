"""The errors reference page, read from Cairn's exception tree (``cairn.errors``) and the
workflows' retry policies: each error's place in the tree, whether Temporal retries it, the
``cairn`` command's exit code for it and what it means."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from workers.reference.markdown import cell, table

__all__ = ["page", "tree"]


def tree(root: type | None = None, depth: int = 0) -> Iterator[tuple[int, type]]:
    """``root`` and every subclass below it, depth first in definition order."""
    if root is None:
        from cairn.errors import CairnError

        root = CairnError
    yield depth, root
    for sub in root.__subclasses__():
        yield from tree(sub, depth + 1)


def _summary(cls: type) -> str:
    return cell((cls.__doc__ or "").strip().split("\n\n")[0])


def _seconds(value: timedelta | None) -> str:
    return "-" if value is None else f"{value.total_seconds():g} s"


def _policies() -> list[tuple[str, str, str, str, str, str]]:
    from workflows import gang_policy, segments

    uses = {
        "SEGMENT_RETRY": (segments.SEGMENT_RETRY, "a training segment (and a gang's coordinating activity)"),
        "WARM_RETRY": (segments.WARM_RETRY, "a segment offered to the worker that holds the run warm: a failure goes "
                       "back to the workflow, which offers it to every worker"),
        "NODE_RETRY": (gang_policy.NODE_RETRY, "one node of a gang: never retried alone, the gang is retried whole"),
        "SHORT_RETRY": (segments.SHORT_RETRY, "bookkeeping: opening the run, listing, retention, journal, effects"),
    }  # fmt: skip
    rows = []
    for name, (policy, use) in uses.items():
        attempts = "unlimited" if not policy.maximum_attempts else str(policy.maximum_attempts)
        rows.append(
            (
                f"`{name}`",
                use,
                _seconds(policy.initial_interval),
                f"{policy.backoff_coefficient:g}",
                _seconds(policy.maximum_interval),
                attempts,
            )
        )
    return rows


def page() -> str:
    rows = []
    for depth, cls in tree():
        name = f"{'&nbsp;&nbsp;' * depth}{'└ ' if depth else ''}`{cls.__name__}`"
        rows.append((name, "yes" if cls.retryable else "no", cls.exit_code, _summary(cls)))
    out = [
        "# Errors and exit codes",
        "",
        "Every error Cairn raises on purpose is a `cairn.errors.CairnError`. Its message is one line",
        "naming the field, with what was expected and what was found. Policy is declared on the classes,",
        "never guessed from text: an activity turns `retryable` into a Temporal `ApplicationError`",
        "(`non_retryable` when false) and the `cairn` command exits with `exit_code`. A checkpoint error",
        "describes bytes that will not change on a second read, so it is never retried. Generated from",
        "`cairn.errors` at build time.",
        "",
        table(("error", "retryable", "exit code", "meaning"), rows),
        "",
        "A `cairn` command prints one line on stderr (`cairn: error: <Type>: <field>: <what> (expected …,",
        "found …)`); with `--json` the error is also one JSON object on stdout; `--debug` adds the",
        "traceback. Usage errors (an unknown command or option) exit 2.",
        "",
        "## Retry policies",
        "",
        "How the workflow retries an activity whose error is retryable (a worker lost mid-segment is",
        "detected by its heartbeat timeout, `heartbeat_timeout_seconds` of the run input).",
        "",
        table(("policy", "used for", "first retry after", "backoff", "longest wait", "attempts"), _policies()),
    ]
    return "\n".join(out) + "\n"
