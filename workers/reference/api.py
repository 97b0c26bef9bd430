"""The Python API reference page: each package of ``cairn`` and the public names it exports
(``__all__``), rendered by mkdocstrings from the docstrings and signatures in the code."""

from __future__ import annotations

import importlib
from pathlib import Path

from workers.reference.markdown import cell

__all__ = ["packages", "page"]


def packages() -> list[str]:
    """Every package of ``cairn``, in import order of the layers (the root first)."""
    import cairn

    root = Path(cairn.__file__).parent
    found = [".".join(("cairn", *p.parent.relative_to(root).parts)) for p in root.rglob("__init__.py")]
    return sorted(name for name in found if "__pycache__" not in name)


def page() -> str:
    out = [
        "# Python API",
        "",
        "The public names of each `cairn` package: what its `__init__` exports (`__all__`). Anything",
        "else is internal and may change without notice; a change to these names is said in the",
        "[changelog](../changelog.md). Generated from the docstrings at build time.",
        "",
        "| package | what it holds |",
        "|---|---|",
    ]
    names = packages()
    for name in names:
        doc = (importlib.import_module(name).__doc__ or "").strip().split("\n\n")[0]
        out.append(f"| [`{name}`](#{name}) | {cell(doc)} |")
    for name in names:
        members = sorted(importlib.import_module(name).__all__)
        out += ["", f"::: {name}", "    options:", "      show_submodules: false", "      heading_level: 2"]
        out += ["      members:"] + [f"        - {member}" for member in members]
    return "\n".join(out) + "\n"
