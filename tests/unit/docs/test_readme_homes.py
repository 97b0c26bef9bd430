"""Nothing of the old README was lost when it became a landing page: each of its sections (every
heading and every bold-lead paragraph of the 2,146-line README of 2026-12-03, commit 70bdd36) has a
home on the documentation site, and that home exists — the page, and the heading the anchor names.
A page or heading renamed or removed later fails here until the table says where the text went."""

from __future__ import annotations

import functools
import re

import pytest

from tests.conftest import REPO
from workers.reference import pages
from workers.reference.markdown import slug

HOMES: dict[str, str] = {
    "# Cairn — durable, resumable ML training on Temporal": "README.md",
    "## Quick start": "install.md#quick-start",
    "Installing it elsewhere.": "install.md#installing-it-elsewhere",
    "## Bring your own model": "how-to/your-model.md",
    "What the adapter checkpoints": "how-to/your-model.md#what-the-adapter-checkpoints",
    "What an import of a torch checkpoint checks": "how-to/your-model.md#what-an-import-of-a-torch-checkpoint-checks",
    "The update step.": "how-to/your-model.md#the-update-step",
    "Evaluation for any model.": "how-to/your-model.md#evaluation-for-any-model",
    "Data: tensors, datasets, loaders, streams.": "how-to/data.md#data-tensors-datasets-loaders-streams",
    "Mixed precision.": "how-to/mixed-precision.md#in-short",
    "A language model, end to end": "how-to/your-model.md#a-language-model-end-to-end",
    "Epochs with an exact cursor.": "how-to/your-model.md#epochs-with-an-exact-cursor",
    "Reproducibility contract.": "how-to/your-model.md#reproducibility-contract",
    "The trainer interface": "how-to/your-model.md#the-trainer-interface",
    "Trust.": "how-to/your-model.md#trust",
    "Lifecycle record.": "how-to/your-model.md#lifecycle-record",
    "Trainer options are compared as your trainer reads them": (
        "how-to/your-model.md#trainer-options-are-compared-as-your-trainer-reads-them"
    ),
    "## Hugging Face models in and out": "how-to/hugging-face.md",
    "Train any causal LM durably.": "how-to/hugging-face.md#train-any-causal-lm-durably",
    "Export: `cairn ckpt export CKPT DIR --format safetensors`.": (
        "how-to/hugging-face.md#export-cairn-ckpt-export-ckpt-dir-format-safetensors"
    ),
    "From a checkpoint to a model, in Python.": "how-to/hugging-face.md#from-a-checkpoint-to-a-model-in-python",
    "Import: a stage from any Hugging Face directory.": (
        "how-to/hugging-face.md#import-a-stage-from-any-hugging-face-directory"
    ),
    "## The GPU path": "how-to/gpus.md",
    "Reproducibility on a GPU.": "how-to/gpus.md#reproducibility-on-a-gpu",
    "What ran where.": "how-to/gpus.md#what-ran-where",
    "## Distributed training: several ranks, several hosts, any world size": "how-to/distributed.md",
    "On one machine": "how-to/distributed.md#on-one-machine",
    "On Temporal": "how-to/distributed.md#on-temporal",
    "## How it works": "concepts/how-it-works.md",
    "### Where things are": "concepts/how-it-works.md#where-things-are",
    "### Recovery rules (what restores what)": "concepts/recovery-rules.md",
    "### The checkpoint format (v1; v3 adds the blocked layout and per-rank indexes of distributed saves)": (
        "concepts/format.md"
    ),
    "#### Incremental checkpoints": "how-to/incremental-checkpoints.md",
    "### Validated import": "concepts/validated-import.md",
    "Signing.": "how-to/signing.md#in-short",
    "Security notes.": "concepts/validated-import.md#security-notes",
    "## Recovery drills": "how-to/drills.md",
    "The schedule": "how-to/drills.md#the-schedule",
    "The stack.": "how-to/drills.md#the-stack",
    "While it runs": "how-to/drills.md#while-it-runs",
    "Your own run.": "how-to/drills.md#your-own-run",
    "The verdict": "how-to/drills.md#the-verdict",
    "Checkpoint interval advice.": "how-to/checkpoint-interval.md#checkpoint-interval-advice",
    '`checkpoint.every: "auto"`: the interval from what the run measures.': (
        "how-to/checkpoint-interval.md#checkpointevery-auto-the-interval-from-what-the-run-measures"
    ),
    "Fast recovery": "how-to/drills.md#fast-recovery",
    "Drills that must fail.": "how-to/drills.md#drills-that-must-fail",
    "## Commands": "how-to/train-and-checkpoints.md#commands",
    "### Training in-process and checkpoints": "how-to/train-and-checkpoints.md#training-in-process-and-checkpoints",
    "Which trainer a tool imports.": "how-to/train-and-checkpoints.md#which-trainer-a-tool-imports",
    "Before the first step": "how-to/train-and-checkpoints.md#before-the-first-step",
    "Cadence and progress.": "how-to/train-and-checkpoints.md#cadence-and-progress",
    "Ctrl-C.": "how-to/train-and-checkpoints.md#ctrl-c",
    "Divergence.": "how-to/train-and-checkpoints.md#divergence",
    "### Runs on Temporal": "how-to/runs.md",
    "The dev stack": "how-to/runs.md#the-dev-stack",
    "Bad input fails the run at once.": "how-to/runs.md#bad-input-fails-the-run-at-once",
    "Control semantics.": "how-to/runs.md#control-semantics",
    "## Operating it": "how-to/operating.md",
    "Process model.": "how-to/operating.md#process-model",
    "Under systemd or Kubernetes": "how-to/operating.md#under-systemd-or-kubernetes",
    "Metrics.": "how-to/operating.md#metrics",
    "Logs.": "how-to/operating.md#logs",
    "Reports.": "how-to/operating.md#reports",
    "Starting runs from the Web UI": "how-to/web-ui-and-temporal-cli.md#starting-runs-from-the-web-ui",
    "Retention.": "how-to/operating.md#retention",
    "What counts as committed.": "how-to/operating.md#what-counts-as-committed",
    "Nothing in a store is read whole before its size is checked.": (
        "how-to/operating.md#nothing-in-a-store-is-read-whole-before-its-size-is-checked"
    ),
    "Environment variables.": "how-to/operating.md#environment-variables",
    "### Running against production Temporal and S3": (
        "how-to/production.md#running-against-production-temporal-and-s3"
    ),
    "### Deploying": "how-to/production.md#deploying",
    "### Upgrading workers while runs are running": "how-to/upgrading-workers.md",
    "Upgrade workers before they meet new checkpoints.": (
        "how-to/upgrading-workers.md#upgrade-workers-before-they-meet-new-checkpoints"
    ),
    "## Configuration": "how-to/configuration.md",
    "### File formats, overrides and the schema": "how-to/configuration.md#file-formats-overrides-and-the-schema",
    "### Trainer config (`examples/config.json`)": "reference/trainer-config.md",
    "Bounded input.": "how-to/configuration.md#bounded-input",
    "### Run input (`examples/run.json`, the workflow's input)": "reference/run-input.md",
    "Warm segments.": "how-to/runs.md#warm-segments",
    "A fast local tier.": "how-to/local-tier.md#a-fast-local-tier",
    "One store, one writer.": "how-to/stores.md#one-store-one-writer",
    "### Stores": "how-to/stores.md#stores",
    "#### Many writers on S3": "how-to/stores.md#many-writers-on-s3",
    "### External effects": "how-to/effects.md",
    "### Failure modes you may meet": "how-to/troubleshooting.md#failure-modes-you-may-meet",
    "## Tests": "development.md#tests",
    "## Benchmarks": "benchmarks.md#running-the-benchmarks",
    "## Determinism": "concepts/determinism.md#determinism",
    "### Numerics profiles: the same bits on every machine of a fleet": (
        "concepts/determinism.md#numerics-profiles-the-same-bits-on-every-machine-of-a-fleet"
    ),
}
"""Each section of the old README (its heading, or the bold words that opened a paragraph) and
where it lives now: a page of ``docs/`` (or a generated Reference page), with the anchor of the
heading it sits under."""

_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


@functools.cache
def _generated() -> dict[str, str]:
    return pages()


def page_text(path: str) -> str:
    """A page's Markdown: a file of ``docs/`` (with what it includes), a generated page, or the README."""
    if path == "README.md":
        return (REPO / "README.md").read_text()
    generated = _generated()
    if path in generated:
        return generated[path]
    text = (REPO / "docs" / path).read_text()
    for include, start in re.findall(r'^--8<-- "([^":]+)(?::(\d+):)?"$', text, re.MULTILINE):
        included = (REPO / include).read_text().splitlines()[int(start or 1) - 1 :]
        text += "\n" + "\n".join(included)
    return text


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (fenced code left out: a ``# comment`` is no heading)."""
    return {slug(re.sub(r"\{#([\w-]+)\}$", "", heading)) for heading in _HEADING.findall(_FENCE.sub("", text))} | {
        anchor for anchor in re.findall(r"\{#([\w-]+)\}", text)
    }


def missing(home: str) -> str | None:
    """Why ``home`` (``PAGE`` or ``PAGE#ANCHOR``) is no home: no such page, an empty one, or no such
    heading on it; None where it is one."""
    page, _, anchor = home.partition("#")
    try:
        text = page_text(page)
    except FileNotFoundError:
        return f"no page {page}"
    if not text.strip():
        return f"{page} is empty"
    return f"{page} has no heading #{anchor}" if anchor and anchor not in anchors(text) else None


@pytest.mark.parametrize("section", sorted(HOMES))
def test_every_old_readme_section_has_a_home(section: str) -> None:
    assert missing(HOMES[section]) is None, f"{section!r}: {missing(HOMES[section])}"


@pytest.mark.parametrize(
    "home, why",
    [
        ("how-to/no-such-page.md", "no page how-to/no-such-page.md"),
        ("how-to/your-model.md#the-update-steps", "how-to/your-model.md has no heading #the-update-steps"),
        ("reference/cli.md#no-such-command", "reference/cli.md has no heading #no-such-command"),
    ],
)
def test_a_home_that_is_gone_is_seen(home: str, why: str) -> None:
    """The check fails for a page that was removed or a heading that was renamed, of ``docs/``
    and of the generated Reference alike."""
    assert missing(home) == why


def test_the_table_covers_every_section_of_the_old_readme() -> None:
    # 32 headings (the title too) and 56 bold-lead paragraphs; three more bold runs opened a paragraph as emphasis
    # inside it (`bit-identical`, `bit-exact`, a link to BENCHMARKS.md), not as its title.
    assert sum(key.startswith("#") for key in HOMES) == 32 and len(HOMES) == 88


def test_a_lost_heading_is_seen() -> None:
    assert "the-update-step" in anchors("# T\n\n## The update step\n\n```bash\n# not a heading\n```\n")
    assert "not-a-heading" not in anchors("```bash\n# not a heading\n```\n")
