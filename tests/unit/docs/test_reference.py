"""The Reference pages are generated from the code and change when it does: every command and
option of the parser, every field of the run input and trainer config, every public name of the
API, every metric of the registry, every error class and every environment variable the code
reads is on its page — and each check is shown to see a planted difference."""

from __future__ import annotations

import argparse
import ast
import re

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.conftest import REPO
from workers.cli.main import build_parser
from workers.reference import api, cli, environment, errors, home, metrics, pages, schemas

PRODUCT = ("cairn", "workers", "activities", "workflows")
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")


def env_reads(source: str) -> set[str]:
    """The environment variables a module reads or sets: names given to ``os.environ``/``getenv``/an
    ``env`` mapping, and every ``CAIRN_*`` string (the modules name them in constants)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        args: list[ast.expr] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("CAIRN_"):
            args = [node]
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if "environ" in func or "getenv" in func or re.search(r"(^|\.|_)env(\.get|_\w+)?$", func):
                args = node.args[:2]
        elif isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
            args = [node.slice]
        found |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return {name for name in found if _NAME.match(name)}


def code_env_reads() -> dict[str, str]:
    """Every variable the product code reads, and one module that reads it."""
    found: dict[str, str] = {}
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.parent.name == "reference" and path.parent.parent.name == "workers":
                continue  # the table itself
            for name in env_reads(path.read_text()):
                found.setdefault(name, str(path.relative_to(REPO)))
    return found


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages()


def test_every_page_of_the_nav_is_generated(generated: dict[str, str]) -> None:
    nav = set(re.findall(r"(reference/[\w-]+\.md)", (REPO / "mkdocs.yml").read_text()))
    assert nav | {"index.md"} == set(generated)


def test_the_cli_page_has_every_command_and_option(generated: dict[str, str]) -> None:
    text = generated["reference/cli.md"]
    found = list(cli.commands(build_parser()))
    assert len(found) > 30
    for words, sub, _ in found:
        assert f"\n{'#' * min(len(words), 4)} {' '.join(words)}\n" in text, words
        for action in sub._actions:
            for option in action.option_strings:
                if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                    assert f"`{option}" in text, (words, option)


def test_the_cli_page_follows_the_parser() -> None:
    parser = build_parser()
    train = dict((words, sub) for words, sub, _ in cli.commands(parser))[("cairn", "train")]
    train.add_argument("--brand-new-option", metavar="N", help="an option added today")
    text = cli.page(parser)
    assert "`--brand-new-option N`" in text and "an option added today" in text


@pytest.mark.parametrize("kind", ["run-input", "config"])
def test_the_schema_pages_have_every_field_with_its_description(kind: str, generated: dict[str, str]) -> None:
    from workers.cli.schema import schema

    text = generated[{"run-input": "reference/run-input.md", "config": "reference/trainer-config.md"}[kind]]
    for name, model in schemas.models(schema(kind)):
        assert f"\n## {name}\n" in text, name
        for field, spec in model.get("properties", {}).items():
            row = next((line for line in text.splitlines() if line.startswith(f"| `{field}` |")), None)
            assert row is not None, (name, field)
            if spec.get("description"):
                assert " ".join(schemas.prose(spec["description"]).split())[:40] in text, (name, field)


def test_the_trainer_config_page_lists_each_built_in_trainers_options(generated: dict[str, str]) -> None:
    from cairn.trainers import trainer_options_model

    text = generated["reference/trainer-config.md"]
    for factory in schemas.BUILT_IN_TRAINERS:
        assert f"### `{factory}`" in text
        for field in trainer_options_model(factory).model_fields:
            assert f"| `{field}` |" in text, (factory, field)


def test_the_schema_page_follows_the_model() -> None:
    from pydantic import BaseModel, Field

    class Planted(BaseModel):
        """A model with a field added today."""

        brand_new: int = Field(3, ge=1, description="a field added today")

    text = "\n".join(schemas._sections(Planted.model_json_schema()))
    assert "| `brand_new` | integer (≥ 1) | `3` | a field added today |" in text


def test_the_api_page_has_every_package_and_public_name(generated: dict[str, str]) -> None:
    import importlib

    text = generated["reference/api.md"]
    from tests.unit.test_public_api import PUBLIC

    assert api.packages() == sorted(PUBLIC)
    for package in api.packages():
        assert f"::: {package}\n" in text
        for name in importlib.import_module(package).__all__:
            assert f"        - {name}\n" in text, (package, name)


def test_the_metrics_page_has_every_metric(generated: dict[str, str]) -> None:
    from activities.metrics import REGISTRY

    text = generated["reference/metrics.md"]
    names = {family.name for family in REGISTRY.collect()} | {
        family.name for collector in REGISTRY._collector_to_names for family in collector.describe()
    }
    assert {"cairn_training_steps", "cairn_tier_pending_bytes", "cairn_checkpoint_save_seconds"} <= names
    for name in names:
        assert f"`{name}" in text, name


def test_the_metrics_page_follows_the_registry() -> None:
    registry = CollectorRegistry()
    Counter("cairn_brand_new", "A metric added today.", ["why"], registry=registry)
    assert ("`cairn_brand_new_total`", "counter", "`why`", "A metric added today.") in metrics.rows(registry)


def test_the_errors_page_has_every_error_with_its_policy(generated: dict[str, str]) -> None:
    text = generated["reference/errors.md"]
    found = list(errors.tree())
    assert len(found) > 30
    for _, cls in found:
        row = next(line for line in text.splitlines() if f"`{cls.__name__}` |" in line)
        assert f"| {'yes' if cls.retryable else 'no'} | {cls.exit_code} |" in row, cls


def test_the_errors_page_follows_the_tree() -> None:
    from cairn.errors import StorageError

    class PlantedError(StorageError):
        """An error added today."""

    assert any(cls is PlantedError for _, cls in errors.tree())
    assert "`PlantedError` | yes | 3 | An error added today. |" in errors.page()


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    documented = {v.name for v in environment.VARIABLES} | set(environment.INTERNAL)
    read = code_env_reads()
    assert {"CAIRN_SIGNING_KEY", "TEMPORAL_ADDRESS", "LOCAL_WORLD_SIZE"} <= set(read)
    missing = {name: where for name, where in read.items() if name not in documented}
    assert missing == {}, f"read by the code, not in workers/reference/environment.py: {missing}"


def test_every_documented_variable_is_read() -> None:
    read = set(code_env_reads())
    tests = {name for path in (REPO / "tests").rglob("*.py") for name in env_reads(path.read_text())}
    unread = [
        v.name
        for v in environment.VARIABLES
        if not v.library and "*" not in v.name and v.name not in read and not (v.read_by == "tests" and v.name in tests)
    ]
    assert unread == []
    assert set(environment.INTERNAL) <= read


def test_the_environment_scan_sees_every_way_of_reading() -> None:
    source = """
import os
A = os.environ.get("PLANTED_ONE")
B = os.getenv("PLANTED_TWO", "x")
C = os.environ["PLANTED_THREE"]
D = _env_number(env, "PLANTED_FOUR", 1)
E = "CAIRN_PLANTED_FIVE"
F = "not an env var"
"""
    assert env_reads(source) == {"PLANTED_ONE", "PLANTED_TWO", "PLANTED_THREE", "PLANTED_FOUR", "CAIRN_PLANTED_FIVE"}


def test_the_generator_is_what_the_site_runs() -> None:
    script = (REPO / "docs" / "gen_reference.py").read_text()
    assert "from workers.reference import pages" in script and "mkdocs_gen_files.open(path" in script


def test_no_generated_page_is_also_written_by_hand(generated: dict[str, str]) -> None:
    assert [path for path in generated if (REPO / "docs" / path).exists()] == []


def test_the_home_page_is_the_readme_with_the_sites_links() -> None:
    readme = (
        "# Cairn\n![a plot](docs/images/drill-timeline.png)\nSee [the tutorial](docs/tutorial.md), "
        "[runs](docs/how-to/runs.md#warm-segments), [numbers](BENCHMARKS.md), [changes](CHANGELOG.md) "
        "and [Temporal](https://temporal.io).\n"
    )
    assert home.page(readme) == (
        "# Cairn\n![a plot](images/drill-timeline.png)\nSee [the tutorial](tutorial.md), "
        "[runs](how-to/runs.md#warm-segments), [numbers](benchmarks.md), [changes](changelog.md) "
        "and [Temporal](https://temporal.io).\n"
    )
    assert home.page() == home.page((REPO / "README.md").read_text())


def test_pages_are_markdown_tables_without_broken_rows(generated: dict[str, str]) -> None:
    for path, text in generated.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("|---"):
                width = line.count("|")
                row = i + 1
                while row < len(lines) and lines[row].startswith("|"):
                    cells = re.sub(r"\\\|", "", re.sub(r"`[^`]*`", "", lines[row])).count("|")
                    assert cells == width, (path, lines[row])
                    row += 1
