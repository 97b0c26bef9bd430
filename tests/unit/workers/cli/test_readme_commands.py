"""The docs' commands work as printed: the README's and every page of the documentation site
(``docs/``). Every command line of their fenced shell blocks is either run here, from the docs'
own words (placeholders such as ``CKPT`` filled in, optional ``[--flag X]`` groups taken or left
out), run as printed by a test of another module that holds it (``RUN_ELSEWHERE``; the tutorial's,
every one, by ``tests/integration/test_tutorial.py``), or listed in ``NOT_RUN_HERE`` with the
reason; a command added to a page fails ``test_every_readme_command_is_run_here_or_listed`` until it
is one or the other."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO
from workers.cli.main import main

README = REPO / "README.md"
PAGES = (README, *sorted((REPO / "docs").rglob("*.md")))
"""The pages whose commands count: the README and the site's (the Reference is generated and
prints usage lines, not commands)."""


def docs_text() -> str:
    """Every page's text, one after another."""
    return "\n\n".join(page.read_text() for page in PAGES)


PROGRAMS = ("cairn", "jq", "make", "python", "temporal")
"""The programs the docs run; a block of other kind holding only their command lines hides commands
(``hidden_commands``)."""
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"\s+#\s.*$")


def readme_commands(text: str) -> list[str]:
    """The command lines of the fenced blocks: every line of a ``bash``/``sh`` block (but comments
    and a synopsis's option lines, ``[--flag X]``), and the ``$ `` lines of the others (transcripts:
    what follows a prompt is a command, the rest output); a trailing comment dropped, ``\\``
    continuations joined."""
    found: list[str] = []
    for lang, body in _BLOCK.findall(text):
        lines = body.splitlines()
        while lines:
            line = lines.pop(0).strip()
            prompted = line.startswith("$ ")
            line = line.removeprefix("$ ")
            while line.endswith("\\") and lines:
                line = line[:-1].rstrip() + " " + lines.pop(0).strip()
            if prompted or (lang in ("bash", "sh") and line and not line.startswith(("#", "["))):
                found.append(" ".join(_COMMENT.sub("", line).split()))
    return found


def readme_words(command: str, fill: Mapping[str, str] = {}, take: Collection[str] = ()) -> list[str]:
    """A README command as arguments of ``cairn`` (its program name dropped): its words, each
    optional ``[...]`` group whose first flag is in ``take`` included (with the first of ``a|b``
    alternatives), the others left out; a word, or a path segment of one, named in ``fill``
    replaced (``...`` by several words: ``fill["..."]`` split)."""
    assert command in readme_commands(docs_text()), f"not a command of the docs: {command}"
    tokens, words = shlex.split(command), []
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("["):
            words.append(token)
            continue
        group = [token[1:]]
        while not group[-1].endswith("]"):
            group.append(tokens.pop(0))
        group[-1] = group[-1][:-1]
        if group[0] in take:
            words += [word.split("|")[0] for word in group]
    out: list[str] = []
    for word in words[1:]:
        if word == "..." and "..." in fill:
            out += fill["..."].split()
        else:
            out.append(fill.get(word, "/".join(fill.get(part, part) for part in word.split("/"))))
    return out


def cairn(capsys: pytest.CaptureFixture[str], words: list[str]) -> str:
    code = main(words)
    out, err = capsys.readouterr()
    assert code == 0, (words, err)
    return out


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory where the README's relative paths (``examples/...``) resolve."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- "Training in-process and checkpoints" ---------------------------------------------------------
TRAIN = "cairn train --config examples/config.json --steps 40 --store runs [--checkpoint-every 10] [--run-id ID]"
RESUME = "cairn train --resume runs/ID/training/000000000017 --steps 23 --store runs"
WEIGHTS_ONLY = "cairn train --resume CKPT --steps 23 --store runs --weights-only"
SHOW = "cairn ckpt show CKPT"
DIGITS = "cairn train --config examples/digits.json --steps 200 --store runs"
TRAINER = "cairn train --config my.json --trainer mypkg.train:MyTrainer ..."
NUMERICS = "cairn train ... [--numerics x86-64-v3|x86-64-v2|x86-64-v4|native]"
TOLERANCE = "cairn train --resume CKPT --steps 5 --store runs --tolerance"
EVAL = "cairn eval CKPT [--split val|test] [--config C]"
VERIFY = "cairn ckpt verify CKPT [--config C]"
FORMAT_ONLY = "cairn ckpt verify CKPT --format-only"
EXPORT = "cairn ckpt export CKPT DIR --format safetensors [--weights-only] [--max-file-size 5GB] [--config C]"
COMPARE = "cairn ckpt compare A B [--rtol R --atol A] [--config C]"
COPY = "cairn ckpt copy CKPT STORE"
LIST = "cairn ckpt list STORE [--run RUN] [--json]"
GC = "cairn ckpt gc STORE --run RUN [--keep-last 3] [--keep-every M] [--grace-seconds 3600] [--dry-run]"
PIN = "cairn ckpt pin CKPT --name best"
UNPIN = "cairn ckpt unpin STORE --run RUN --name best"
# -- "Hugging Face models in and out" -------------------------------------------------------------
HF_CONFIG = "jq .config my-hf-run.json > my-hf.json"
HF_EXPORT = (
    "cairn ckpt export s3://cairn/runs/hf-gpt2/training/000000000400 ./my-gpt2-tuned --format safetensors "
    "--config my-hf.json"
)
GPT2_TRAIN = "cairn train --config examples/hf-gpt2.json --steps 40 --store runs --run-id gpt2"
GPT2_EXPORT = (
    "cairn ckpt export runs/gpt2/training/000000000040 gpt2-out --format safetensors --config examples/hf-gpt2.json"
)

# -- "File formats, overrides and the schema" -----------------------------------------------------
SET_TRAIN = (
    "cairn train --config examples/config.json --set optimizer.lr=0.01 --set model.hidden=8 --steps 20 "
    "--store /tmp/cairn-set"
)
SCHEMA_CONFIG = "cairn schema config --trainer examples.digits:DigitsCNN > cairn-config.schema.json"
SCHEMA_RUN = "cairn schema run-input > cairn-run.schema.json"
# -- "Fine-tune a pretrained model on your data" --------------------------------------------------
FINETUNE_BASE = "python -m examples.finetune base /tmp/cairn-finetune/base"
FINETUNE_DATA = "python -m examples.finetune data /tmp/cairn-finetune/instructions.jsonl"
# -- "Recovery drills" and "Checkpoint interval" ---------------------------------------------------
PLAN = "cairn plan-interval --report cairn-report-drill/drill.json"
PLAN_MTBF = "cairn plan-interval --report cairn-report-drill/drill.json --mtbf-seconds 86400"

_IN_PROCESS = "test_the_in_process_commands_work_as_printed"
RUN_HERE = {
    **dict.fromkeys(
        (
            TRAIN,
            RESUME,
            WEIGHTS_ONLY,
            SHOW,
            DIGITS,
            TRAINER,
            NUMERICS,
            TOLERANCE,
            EVAL,
            VERIFY,
            FORMAT_ONLY,
            EXPORT,
            COMPARE,
            COPY,
            LIST,
            GC,
            PIN,
            UNPIN,
        ),
        _IN_PROCESS,
    ),  # fmt: skip
    HF_CONFIG: "test_the_hugging_face_export_works_as_printed (where jq is installed)",
    HF_EXPORT: "test_the_hugging_face_export_works_as_printed",
    GPT2_TRAIN: "test_a_checkpoint_loads_as_a_model_as_printed",
    GPT2_EXPORT: "test_a_checkpoint_loads_as_a_model_as_printed",
    SET_TRAIN: "test_overrides_and_the_schema_work_as_printed",
    SCHEMA_CONFIG: "test_overrides_and_the_schema_work_as_printed",
    SCHEMA_RUN: "test_overrides_and_the_schema_work_as_printed",
    FINETUNE_BASE: "test_the_fine_tuning_inputs_are_made_as_printed",
    FINETUNE_DATA: "test_the_fine_tuning_inputs_are_made_as_printed",
    PLAN: "test_the_interval_advice_works_as_printed",
    PLAN_MTBF: "test_the_interval_advice_works_as_printed",
}
"""Each README command run by a test of this module, from the README's words."""

_TEMPORAL_CLI = "tests/integration/test_docs_temporal_cli.py::test_the_temporal_cli_commands_work_as_printed"
_WORLD_SIZES = "tests/integration/test_docs_distributed.py::test_the_world_size_transcript_runs_as_printed"
_DCP = "tests/unit/workers/cli/test_ckpt.py::test_the_dcp_export_loads_in_plain_pytorch_as_printed"
RUN_ELSEWHERE = {
    **dict.fromkeys(
        (
            "temporal workflow start --type TrainingRun --task-queue cairn-training --workflow-id example-run "
            "--input-file examples/run.json",
            "temporal workflow start --type TrainingRun --task-queue cairn-training --task-timeout 2s --workflow-id "
            "example-run --input-file examples/run.json",
            "temporal workflow signal --workflow-id example-run --name pause",
            "temporal workflow signal --workflow-id example-run --name resume",
            "temporal workflow signal --workflow-id example-run --name stop",
            "temporal workflow signal --workflow-id example-run --name checkpoint_now",
            "temporal workflow signal --workflow-id example-run --name rollback --input 40",
            "temporal workflow query --workflow-id example-run --type progress",
            "temporal workflow query --workflow-id example-run --type info",
            "temporal workflow describe --workflow-id example-run",
            "temporal workflow show --workflow-id example-run",
            "temporal workflow result --workflow-id example-run",
            "temporal workflow list --query \"WorkflowType='TrainingRun'\"",
            "temporal workflow cancel --workflow-id example-run",
            'temporal workflow terminate --workflow-id example-run --reason "stuck: see the worker log"',
        ),
        _TEMPORAL_CLI,
    ),
    **dict.fromkeys(
        (
            "cairn train --config examples/distributed.json --store runs --run-id dp --steps 40 --world-size 4",
            "cairn train --resume runs/dp/training/000000000040 --store runs --steps 40 --world-size 2",
            "cairn train --config examples/distributed.json --store ref --run-id dp --steps 80",
            "cairn ckpt compare runs/dp/training/000000000080 ref/dp/training/000000000080",
            "cairn ckpt show runs/dp/training/000000000040 | sed -n 2,7p",
        ),
        _WORLD_SIZES,
    ),
    "cairn train --config examples/distributed.json --steps 40 --store runs --world-size 4": "tests/integration/"
    "test_docs_distributed.py::test_the_four_rank_line_trains_as_printed",
    "cairn train --config examples/digits.json --steps 20 --store runs --run-id digits": _DCP,
    "cairn ckpt export runs/digits/training/000000000020 digits-dcp --format dcp": _DCP,
    'eval "$(register-python-argcomplete cairn)"': "tests/unit/workers/cli/test_main.py::"
    "test_the_docs_completion_line_registers_cairn_in_bash",
}
"""Each docs command a test of another module runs as printed: that test, ``FILE::FUNCTION``, whose
module holds the command word for word (``test_each_command_run_elsewhere_is_held_there``)."""

_TEMPORAL = "needs a Temporal server and workers: "
_NONE = "not run by any test: "
NOT_RUN_HERE = {
    "make demo": _NONE + "the demo itself (about 2 minutes; its parts are the integration tests' scenarios)",
    "make test": "the suite itself",
    "cairn train --config examples/finetune-lora.json --steps 40 --store runs --run-id lora": _NONE
    + "its paths are the example's /tmp/cairn-finetune (tests/unit/trainers/hf/test_fine_tune_files.py trains "
    "this config's shape; tests/integration/test_finetune.py runs it on Temporal with the paths in its temp dir)",
    "cairn run start examples/finetune-run.json": _TEMPORAL + "tests/integration/test_finetune.py starts this run "
    "file (its paths moved into its temp dir) from Python, LoRA and full, with a worker SIGKILLed",
    "cairn run watch finetune-lora": _TEMPORAL + "follows the run above (test_run_truth.py covers watch)",
    "cairn ckpt export s3://cairn/runs/finetune-lora/training/000000000060 adapter --format peft --config "
    "examples/finetune-lora.json": _NONE + "follows the run above (tests/integration/test_finetune.py exports its "
    "final checkpoint --format peft and loads it with PeftModel)",
    "cairn ckpt export s3://cairn/runs/finetune-lora/training/000000000060 merged --format safetensors --config "
    "examples/finetune-lora.json": _NONE + "follows the run above (tests/integration/test_finetune.py exports and "
    "loads it with from_pretrained)",
    "make docs": "tests/unit/docs/test_site.py builds the site as it does (mkdocs build --strict, into a temporary "
    "directory)",
    "make drill": _NONE + "as printed: it installs the demo's extras, then drills in the checkout and writes "
    "cairn-report-drill there (tests/integration/test_drill.py runs `cairn drill` with other settings)",
    "cairn train --config examples/lm.json --store ./lm-ckpt --steps 400 --checkpoint-every 100": _NONE
    + "400 updates take 87 s (tests/unit/trainers/pytorch/test_models.py trains the same config briefly; "
    "tests/integration/test_lm_run.py on Temporal)",
    "cairn worker --preload cairn.trainers.hf &": _TEMPORAL + "not run as printed (the integration tests start "
    "workers with other options; test_the_hugging_face_export_works_as_printed trains the run with cairn train)",
    "cairn run start my-hf-run.json --wait": _TEMPORAL + "not run as printed (tests/integration/test_cli_stack.py "
    "runs `cairn run start RUN --wait` on the MLP; test_the_hugging_face_export_works_as_printed trains this run's "
    "config with cairn train)",
    "cairn run start examples/distributed-run.json": _TEMPORAL + "not run as printed (tests/integration/"
    "test_distributed.py starts gang runs from Python)",
    "cairn run start examples/distributed-run.json --world-size 2 --total-steps 160 --workflow-id dp-more": _TEMPORAL
    + "not run as printed (tests/unit/workers/cli/test_run.py checks how the flags override the file)",
    "cairn worker --node host-a --advertise-addr 10.0.0.5": _TEMPORAL
    + "not run as printed (tests/unit/workers/cli/test_worker.py parses these options)",
    "cairn run start examples/distributed-run.json --world-size 8 --nodes host-a,host-b --workflow-id dp-2x4": _TEMPORAL
    + "two hosts; not run as printed (tests/integration/test_distributed.py runs two nodes on loopback)",
    "cairn drill --seed 7 --kills 12 --targets all --workers 3": _TEMPORAL + "not run as printed "
    "(tests/integration/test_drill.py runs drills)",
    "cairn drill --run examples/run.json --targets worker-kill,storage-brownout": _TEMPORAL + "not run as printed",
    "cairn drill --run my-run.json --targets worker-kill": _TEMPORAL + "not run as printed",
    "cairn drill --stack env --store s3://my-bucket/drills --targets worker-kill,sigterm,kill-in-upload": _TEMPORAL
    + "an existing stack and bucket; not run as printed",
    "cairn dev up [--config FILE]": _TEMPORAL + "tests/integration/test_cli_stack.py runs it (with test ports, "
    "with and without --config)",
    "cairn run start examples/run.json [--wait] [--task-queue cairn-training] [--workflow-id ID]": _TEMPORAL
    + "tests/integration/test_cli_stack.py and test_cli_operations.py run it on their own run files",
    "cairn schema run-input|config [--trainer FACTORY]": _NONE + "the synopsis "
    "(test_overrides_and_the_schema_work_as_printed runs both kinds, one with --trainer, as printed further down)",
    "cairn run list [--limit 50]": _TEMPORAL + "tests/integration/test_cli_operations.py",
    "cairn run watch ID": _TEMPORAL + "tests/integration/test_cli_operations.py, test_run_truth.py",
    "cairn run status ID | result ID | journal ID": _TEMPORAL + "tests/integration/test_cli_stack.py",
    "cairn run report ID [--out DIR] [--config C]": _TEMPORAL + "tests/integration/test_cli_operations.py",
    "cairn run pause ID | resume ID | stop ID | checkpoint ID | rollback ID STEP | cancel ID": _TEMPORAL
    + "checkpoint and cancel in tests/integration/test_cli_operations.py; pause, resume, stop and rollback are "
    "sent as signals from Python by the integration tests, not from the command line",
    "cairn worker [--address HOST:PORT] [--namespace NS] [--task-queue Q] [--max-activities 4] "
    "[--numerics x86-64-v3]": _TEMPORAL + "tests/integration/test_cli_operations.py starts `cairn worker --address`",
    "cairn dev status | down": _TEMPORAL + "tests/integration/test_cli_stack.py",
    "cairn dev env [--json]": _TEMPORAL + "tests/integration/test_cli_stack.py compares it with `dev up`'s",
    "cairn drill [--seed 1] [--kills 5 | --duration S] [--targets worker-kill,kill-in-upload,...|all]": _TEMPORAL
    + "tests/integration/test_drill.py",
    "cairn plan-interval [--report DRILL.json | --store S --run R [--config C]] [--save-seconds C] "
    "[--mtbf-seconds M]": "tests/unit/workers/cli/test_interval.py",
    "cairn trackers ./store my-run --tensorboard ./tb --mlflow file:$PWD/mlruns --wandb my-project "
    "--wandb-dir ./wandb": "tests/unit/trackers/test_core.py runs it with --tensorboard; each sink's export in "
    "tests/unit/trackers/test_sinks.py",
}
"""Each README command no test of this module runs, and where (if anywhere) it is tested."""


TUTORIAL = REPO / "docs" / "tutorial.md"
"""Its every command is run, in order and as printed, by ``tests/integration/test_tutorial.py``."""


def test_every_readme_command_is_run_here_or_listed() -> None:
    commands = set(readme_commands(docs_text()))
    tutorial = set(readme_commands(TUTORIAL.read_text()))
    here, elsewhere, listed = set(RUN_HERE), set(RUN_ELSEWHERE), set(NOT_RUN_HERE)
    assert not here & elsewhere and not here & listed and not elsewhere & listed
    assert sorted(commands - here - elsewhere - listed - tutorial) == []
    assert sorted((here | elsewhere | listed) - commands) == []


def test_each_command_run_elsewhere_is_held_there() -> None:
    """The test ``RUN_ELSEWHERE`` names exists, and its module holds the command as printed (one
    of its strings, or part of one): a command edited on its page, not there, fails here too."""
    for command, where in RUN_ELSEWHERE.items():
        path, function = where.split("::")
        tree = ast.parse((REPO / path).read_text())
        assert function in {
            node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }, where
        strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and type(node.value) is str]
        assert any(command in text for text in strings), (command, where)


_TEXT_LANGS = ("", "text", "console")


def hidden_commands(text: str) -> list[str]:
    """Blocks that are not ``bash``/``sh`` yet hold nothing but command lines (each line, ``\\``
    continuations joined, starts with one of ``PROGRAMS``): commands a reader copies that
    ``readme_commands`` would not count. Output may start with a program's name (``temporal
    started ...``): a block with any other line is output, not hidden commands."""
    hidden = []
    for lang, body in _BLOCK.findall(text):
        lines = [line.strip() for line in body.replace("\\\n", " ").splitlines() if line.strip()]
        if lang in _TEXT_LANGS and lines and all(line.split(" ", 1)[0] in PROGRAMS for line in lines):
            hidden.append(body)
    return hidden


def test_no_command_hides_in_a_text_block() -> None:
    """A command shown in a ``text`` block would escape the count above: the docs print commands
    in ``bash`` blocks (or after ``$ `` in a transcript)."""
    assert hidden_commands(docs_text()) == []
    planted = "```text\ntemporal workflow cancel \\\n  --workflow-id x\n```\n"
    assert hidden_commands(planted) == ["temporal workflow cancel \\\n  --workflow-id x\n"]
    assert hidden_commands("```text\ntemporal     started (pid 1)\nTemporal   127.0.0.1:7233\n```\n") == []


def _readme_block_after(marker: str) -> str:
    """The body of the first fenced block of the docs after ``marker``."""
    text = docs_text()
    return str(_BLOCK.findall(text[text.index(marker) :])[0][1])


def _readme_json_after(marker: str) -> dict[str, object]:
    """The first ``json`` block of the docs after ``marker``."""
    text = docs_text()
    lang_body = next((lang, b) for lang, b in _BLOCK.findall(text[text.index(marker) :]) if lang == "json")
    body: dict[str, object] = json.loads(lang_body[1])
    return body


MY_TRAINER = """from examples.digits import DigitsCNN


class MyTrainer(DigitsCNN):
    \"\"\"The README's user trainer: the digits CNN under the user's import path.\"\"\"
"""


@pytest.fixture
def mypkg(here: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``mypkg.train:MyTrainer`` importable here, and ``my.json`` naming it (the small digits config)."""
    (here / "mypkg").mkdir()
    (here / "mypkg" / "__init__.py").write_text("")
    (here / "mypkg" / "train.py").write_text(MY_TRAINER)
    monkeypatch.syspath_prepend(str(here))
    body = json.loads((REPO / "examples" / "digits.json").read_text())
    body["trainer"]["factory"] = "mypkg.train:MyTrainer"  # as the README's my.json names it
    body["trainer"]["options"].update({"channels": 4, "hidden": 16})
    (here / "my.json").write_text(json.dumps(body))
    yield here / "my.json"
    for name in ("mypkg.train", "mypkg"):
        sys.modules.pop(name, None)


def test_the_in_process_commands_work_as_printed(here: Path, mypkg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block of "Training in-process and checkpoints", line by line, in one working directory."""
    config = {"C": "examples/config.json"}
    at40 = cairn(capsys, readme_words(TRAIN, {"ID": "demo"}, take=("--checkpoint-every", "--run-id"))).strip()
    assert at40 == str(here / "runs/demo/training/000000000040")
    assert sorted(int(m.parent.name) for m in (here / "runs/demo").rglob("manifest.json")) == [10, 20, 30, 40]
    cairn(capsys, ["train", "--config", "examples/config.json", "--steps", "17", "--store", "runs", "--run-id", "demo"])
    at17 = "runs/demo/training/000000000017"
    assert cairn(capsys, readme_words(RESUME, {"ID": "demo"})).strip() == at40  # 17 + 23: step 40's very commit
    weights = cairn(capsys, readme_words(WEIGHTS_ONLY, {"CKPT": at17})).strip()
    assert weights == str(here / "runs/demo-weights-only/training/000000000023")
    assert cairn(capsys, readme_words(SHOW, {"CKPT": at40})).startswith(f"checkpoint   {at40}")
    digits = cairn(capsys, readme_words(DIGITS)).strip()
    assert digits.endswith("/training/000000000200")
    mine = cairn(capsys, readme_words(TRAINER, {"...": "--steps 3 --store runs --run-id mine"})).strip()
    assert mine == str(here / "runs/mine/training/000000000003")
    numerics = {"...": "--config examples/config.json --steps 2 --store runs --run-id numerics"}
    cairn(capsys, readme_words(NUMERICS, numerics, take=("--numerics",)))
    assert cairn(capsys, readme_words(TOLERANCE, {"CKPT": at40})).strip().endswith("/training/000000000045")
    evaluated = cairn(
        capsys, readme_words(EVAL, {"CKPT": digits, "C": "examples/digits.json"}, ("--split", "--config"))
    )
    assert evaluated.startswith("val at step 200: loss ")
    verified = cairn(capsys, readme_words(VERIFY, {"CKPT": mine, "C": "my.json"}, take=("--config",)))
    assert verified.startswith("ok: ") and "model and dataset hash checked" in verified
    assert "--format-only: integrity" in cairn(capsys, readme_words(FORMAT_ONLY, {"CKPT": mine}))
    take = ("--weights-only", "--max-file-size", "--config")
    cairn(capsys, readme_words(EXPORT, {"CKPT": at40, "DIR": "weights", **config}, take))
    assert (here / "weights" / "weights-only.safetensors").is_file()
    cairn(capsys, readme_words(COPY, {"CKPT": at40, "STORE": "elsewhere"}))
    copied = "elsewhere/demo/training/000000000040"
    same = cairn(capsys, readme_words(COMPARE, {"A": at40, "B": copied, **config}, take=("--config",)))
    assert same.startswith("identical")
    listed = json.loads(cairn(capsys, readme_words(LIST, {"STORE": "runs", "RUN": "demo"}, ("--run", "--json"))))
    assert [r["step"] for r in listed["checkpoints"]] == [10, 17, 20, 30, 40, 45]
    cairn(capsys, readme_words(PIN, {"CKPT": at17}))
    planned = cairn(capsys, readme_words(GC, {"STORE": "runs", "RUN": "demo"}, take=("--keep-last", "--dry-run")))
    assert "keep   " in planned and "would delete" in planned and f"{at17}" not in planned.split("would delete", 1)[1]
    cairn(capsys, readme_words(UNPIN, {"STORE": "runs", "RUN": "demo"}))


def test_overrides_and_the_schema_work_as_printed(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The overrides line trains with the overridden fields (its store moved into the test's
    directory); the schema lines, run in a shell as printed, write schemas every shipped example
    validates against (and a wrong trainer option does not)."""
    jsonschema = pytest.importorskip("jsonschema")
    from cairn.checkpoint import CheckpointRef, read_manifest
    from cairn.stores import LocalStore

    ref = cairn(capsys, readme_words(SET_TRAIN, {"/tmp/cairn-set": "set-runs"})).strip()
    manifest = read_manifest(LocalStore(str(here / "set-runs")), CheckpointRef.parse(ref), expect_kind=None)
    assert manifest.config is not None
    assert manifest.config["optimizer"]["lr"] == 0.01 and manifest.config["model"]["hidden"] == 8
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in (SCHEMA_CONFIG, SCHEMA_RUN):
        subprocess.run(line, shell=True, check=True, cwd=here, env=env, timeout=120)
    digits = jsonschema.Draft202012Validator(json.loads((here / "cairn-config.schema.json").read_text()))
    example = json.loads((REPO / "examples" / "digits.json").read_text())
    assert list(digits.iter_errors(example)) == []
    example["trainer"]["options"]["no_such_option"] = 1
    wrong = jsonschema.exceptions.best_match(digits.iter_errors(example))
    assert wrong is not None and "'no_such_option' was unexpected" in wrong.message, wrong
    runs = jsonschema.Draft202012Validator(json.loads((here / "cairn-run.schema.json").read_text()))
    shipped = sorted((REPO / "examples").glob("*-run.json")) + [REPO / "examples" / "run.json"]
    assert len(shipped) >= 5
    for path in shipped:
        assert list(runs.iter_errors(json.loads(path.read_text()))) == [], path


def test_the_hugging_face_export_works_as_printed(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fine-tuning run's export, as the README prints it: the run itself (on Temporal there)
    is trained here by ``cairn train`` on the run file's config, from a Hugging Face directory
    written by an export too."""
    pytest.importorskip("transformers")
    run_file = _readme_json_after("(`my-hf-run.json`")
    config = run_file["config"]
    assert isinstance(config, dict)
    base = {k: v for k, v in config.items() if k not in ("stage", "init_from")}
    (here / "base.json").write_text(json.dumps(base))
    origin = cairn(capsys, ["train", "--config", "base.json", "--steps", "0", "--store", "origin"]).strip()
    cairn(capsys, ["ckpt", "export", origin, "models/my-gpt2", "--format", "safetensors", "--config", "base.json"])
    config["init_from"] = {"safetensors": str(here / "models" / "my-gpt2")}
    (here / "my-hf-run.json").write_text(json.dumps(run_file))
    if shutil.which("jq"):
        subprocess.run(HF_CONFIG, shell=True, check=True, cwd=here)
        assert json.loads((here / "my-hf.json").read_text()) == config
    else:  # what the README's jq line does
        (here / "my-hf.json").write_text(json.dumps(config))
    cairn(capsys, ["train", "--config", "my-hf.json", "--steps", "2", "--store", "runs", "--run-id", "hf-gpt2"])
    fill = {"s3://cairn/runs/hf-gpt2/training/000000000400": str(here / "runs/hf-gpt2/training/000000000002")}
    cairn(capsys, readme_words(HF_EXPORT, fill))
    exported = sorted(p.name for p in (here / "my-gpt2-tuned").iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(exported), exported


def test_a_checkpoint_loads_as_a_model_as_printed(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's "From a checkpoint to a model, in Python": its two commands, then its Python example."""
    pytest.importorskip("transformers")
    cairn(capsys, readme_words(GPT2_TRAIN))
    cairn(capsys, readme_words(GPT2_EXPORT))
    text = docs_text()
    example = next(
        b for lang, b in _BLOCK.findall(text[text.index("From a checkpoint to a model") :]) if lang == "python"
    )
    assert "cairn.load_model(" in example and "torch.equal(" in example
    exec(compile(example, "README.md", "exec"), {})  # its assert: the exported directory's logits, bit for bit


def test_the_fine_tuning_inputs_are_made_as_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fine-tuning page's two lines (``/tmp/cairn-finetune`` moved into the test's folder):
    a pretrained directory ``from_pretrained`` reads and an instruction file the data options read."""
    pytest.importorskip("transformers")
    from examples.finetune import main as finetune

    fill = {f"/tmp/cairn-finetune/{name}": str(tmp_path / name) for name in ("base", "instructions.jsonl")}
    for line in (FINETUNE_BASE, FINETUNE_DATA):
        words = readme_words(line, fill)
        assert words[:2] == ["-m", "examples.finetune"], words
        assert finetune(words[2:]) == 0
    made = capsys.readouterr().out.split()
    assert made == [str(tmp_path / "base"), str(tmp_path / "instructions.jsonl")]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "base").iterdir()}
    first = json.loads((tmp_path / "instructions.jsonl").read_text().splitlines()[0])
    assert set(first) == {"prompt", "response"}


def test_the_interval_advice_works_as_printed(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The two ``plan-interval`` lines, where ``cairn-report-drill/drill.json`` holds the
    measurements each page prints (in "A real report", the drill's own advice; in "Checkpoint
    interval", the transcript's), as values their rounded figures stand for (20.5 ms: 0.02049 s,
    10 steps of which print as 0.20 s): each line prints the advice its page shows."""
    drill = _readme_block_after("## A real report")
    own = drill[drill.index("checkpoint interval (Young/Daly") :].splitlines()[1:4]
    interval = _readme_block_after("(its save cost was 0.109 s) and one failure a day").splitlines()
    assert interval[0] == f"$ {PLAN_MTBF}"
    for line, measured, shown in (
        (PLAN, {"save": 0.056, "mtbf": 6.6, "step": 0.02049, "restart": 4.3}, [text.strip() for text in own]),
        (PLAN_MTBF, {"save": 0.109, "mtbf": 6.6, "step": 0.0218, "restart": 4.4}, interval[1:]),
    ):
        report = {
            "checkpoint_every": 10,
            "interval": {
                "measured": {
                    "save_seconds_median": measured["save"],
                    "mtbf_seconds": measured["mtbf"],
                    "step_seconds": measured["step"],
                }
            },
            "faults": [{"recovery_s": measured["restart"]}],
        }
        (here / "cairn-report-drill").mkdir(exist_ok=True)
        (here / "cairn-report-drill" / "drill.json").write_text(json.dumps(report))
        assert cairn(capsys, readme_words(line)).splitlines() == shown
