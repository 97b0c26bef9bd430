"""The CLI reference page: every command and option of ``cairn``, read from its argparse parser
(``workers.cli.main.build_parser``), so a new option is documented when it is added."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from workers.reference.markdown import cell, prose, slug, table

__all__ = ["commands", "page"]

_EXIT_CODES = """\
| code | meaning |
|---|---|
| 0 | success |
| 1 | a checkpoint was refused, `ckpt compare` found differences, training diverged, or a run failed |
| 2 | bad input: usage, config, reference, path, a missing extra |
| 3 | storage failure (retryable) |
| 4 | an external effect failed |
| 5 | Temporal unreachable or refused the request |
| 130 / 143 | interrupted by SIGINT / SIGTERM (`cairn train` commits a checkpoint first) |
"""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("cairn",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Every command under ``parser``, depth first: its words, its parser and its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                yield (*path, name), child, helps.get(name, "")
                yield from commands(child, (*path, name))


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    return f"`{action.default}`"


def _meaning(action: argparse.Action) -> str:
    text = prose(action.help or "")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += " (one of " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    return text


def _options(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            metavar = action.metavar or (action.dest.upper() if action.nargs != 0 else None)
            name = ", ".join(f"`{o}{' ' + str(metavar) if metavar else ''}`" for o in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest.upper()}`"
        rows.append((name, _default(action), _meaning(action)))
    return table(("argument", "default", "meaning"), rows) if rows else "No arguments."


def page(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown of the CLI reference."""
    if parser is None:
        from workers.cli.main import build_parser

        parser = build_parser()
    found = list(commands(parser))
    out = [
        "# CLI reference",
        "",
        "Generated from the `cairn` command's parser at build time: every command and option, with its",
        "default and help. The [how-to guides](../how-to/train-and-checkpoints.md) show them at work.",
        "",
        "## Global options",
        "",
        f"```text\n{parser.format_usage().strip()}\n```",
        "",
        prose(parser.description),
        "",
        _options(parser),
        "",
        "`--json` and `--debug` are accepted before or after the command (`cairn --json ckpt list STORE`).",
        'Shell completion: `eval "$(register-python-argcomplete cairn)"` (bash/zsh; see argcomplete).',
        "",
        "## Exit codes",
        "",
        _EXIT_CODES,
        "Each error's code is declared on its class: see [errors and exit codes](errors.md).",
        "",
        "## Commands",
        "",
        table(("command", "what it does"), ((f"[`{' '.join(w)}`](#{slug(' '.join(w))})", h) for w, _, h in found)),
    ]
    for words, sub, helptext in found:
        name = " ".join(words)
        out += ["", f"{'#' * min(len(words), 4)} {name}", "", cell(helptext), ""]
        out += [f"```text\n{sub.format_usage().strip()}\n```", ""]
        description = prose(sub.description)
        if description and description != prose(helptext):
            out += [description, ""]
        if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions) or len(sub._actions) > 2:
            out += [_options(sub), ""]
    return "\n".join(out) + "\n"
