"""Generates the Reference pages at build time (mkdocs-gen-files runs this file): every page
comes from the code through ``workers.reference``, so the reference changes when the code does."""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

from workers.reference import pages

for path, text in pages().items():
    with mkdocs_gen_files.open(path, "w") as out:
        out.write(text)

# BENCHMARKS.md (included by benchmarks.md) shows its plots by their repository paths: the site
# carries them at the same paths.
for png in sorted(Path("bench/results").glob("*.png")):
    with mkdocs_gen_files.open(f"bench/results/{png.name}", "wb") as out:
        out.write(png.read_bytes())
