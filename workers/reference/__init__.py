"""The documentation site's home and Reference pages, generated from the code at build time
(``docs/gen_reference.py`` writes them through mkdocs-gen-files; nothing is written by hand).

Modules:

- ``api``: the Python API, each ``cairn`` package's ``__all__`` rendered by mkdocstrings
- ``cli``: every ``cairn`` command and option, from the argparse parser
- ``environment``: the environment variables Cairn reads (the table a test checks against the code)
- ``errors``: the exception tree with retryability and exit codes, and the retry policies
- ``home``: the site's home page, the README with its links made the site's
- ``markdown``: table and text helpers the pages share
- ``metrics``: the Prometheus metrics, from Cairn's registry
- ``schemas``: the run input and the trainer config, from their pydantic models
"""

from __future__ import annotations

__all__ = ["pages"]


def pages() -> dict[str, str]:
    """Every generated page: its path under ``docs/`` and its Markdown."""
    from workers.cli.main import build_parser
    from workers.reference import api, cli, environment, errors, home, metrics, schemas

    parser = build_parser()  # imports every command's modules (and so every error class)
    return {
        "index.md": home.page(),
        "reference/cli.md": cli.page(parser),
        **schemas.pages(),
        "reference/api.md": api.page(),
        "reference/metrics.md": metrics.page(),
        "reference/environment.md": environment.page(),
        "reference/errors.md": errors.page(),
    }
