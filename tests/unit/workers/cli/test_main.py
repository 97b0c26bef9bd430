"""The ``cairn`` entry point (``workers.cli.main``): a reader that went away (``| head``) is not an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.conftest import CONFIG, run


def test_broken_pipe_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    store = tmp_path / "s"
    code, _, train_err = run(
        capsys,
        "train",
        "--config",
        CONFIG,
        "--steps",
        "3",
        "--store",
        str(store),
        "--run-id",
        "r",
        "--checkpoint-every",
        "1",
    )
    assert code == 0, train_err
    # `ckpt list` in a process of its own: the pipe its stdout writes to is really closed (in this
    # process, stdout is pytest's capture).
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "ckpt", "list", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before we write
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        run(capsys, "--version")
    assert done.value.code == 0
    assert capsys.readouterr().out == f"cairn {metadata.version('cairn-train')}\n"


def test_global_flags_before_the_command_mean_what_they_mean_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    store = tmp_path / "s"
    code, _, err = run(capsys, "train", "--config", CONFIG, "--steps", "2", "--store", str(store),
                       "--run-id", "r", "--checkpoint-every", "1")  # fmt: skip
    assert code == 0, err
    before = run(capsys, "--json", "ckpt", "list", str(store))
    after = run(capsys, "ckpt", "list", str(store), "--json")
    assert before[0] == after[0] == 0 and before[1] == after[1]
    assert [c["step"] for c in json.loads(before[1])["checkpoints"]] == [1, 2]
    plain = run(capsys, "ckpt", "list", str(store))
    assert not plain[1].startswith("{")  # without the flag anywhere: the table
    # --debug before the command too: the refusal then carries its traceback
    code, _, err = run(capsys, "--debug", "ckpt", "show", str(tmp_path / "nowhere"))
    assert code == 2 and "Traceback" in err


@pytest.mark.parametrize(
    ("words", "suggestion"),
    [(["trian"], "did you mean 'train'?"), (["ckpt", "lsit", "s"], "did you mean 'list'?"), (["xyzzy"], None)],
)
def test_a_mistyped_command_gets_the_closest_offered(
    capsys: pytest.CaptureFixture[str], words: list[str], suggestion: str | None
) -> None:
    code, out, err = run(capsys, *words)
    assert code == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("cairn: error: UsageError: ") and "invalid choice" in last
    if suggestion is None:
        assert "did you mean" not in last
    else:
        assert last.endswith(suggestion)


def test_shell_completion_completes_commands_and_options(tmp_path: Path) -> None:
    """What ``eval "$(register-python-argcomplete cairn)"`` asks of the command: the words that
    complete the line (argcomplete's protocol: the line in COMP_LINE, the answer in a file)."""
    import os
    import subprocess
    import sys

    def complete(line: str) -> set[str]:
        answer = tmp_path / "completions"
        env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
               "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "workers.cli"], env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return {w.strip() for w in answer.read_text().split("\x0b") if w.strip()}

    assert complete("cairn ckpt li") == {"list"}
    assert {"train", "ckpt", "run", "drill"} <= complete("cairn ")
    assert {"--checkpoint-every", "--config"} <= complete("cairn train --c")


def test_the_docs_completion_line_registers_cairn_in_bash() -> None:
    import os
    import shutil
    import subprocess
    import sys

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    line = 'eval "$(register-python-argcomplete cairn)"'
    assert line in (REPO / "docs" / "how-to" / "train-and-checkpoints.md").read_text()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([bash, "-c", f"{line} && complete -p cairn"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "cairn" in done.stdout and "argcomplete" in done.stdout, done.stdout


def test_the_command_line_loads_no_codec_or_dtype_library_until_a_command_needs_one() -> None:
    """``ml_dtypes`` (half a second to import), Blosc2 and torch are loaded on first use: loading
    the command line, which every ``cairn`` command does before it runs, loads none of them."""
    import subprocess
    import sys

    probe = (
        "import sys, workers.cli.main; print(sorted(m for m in ('ml_dtypes', 'blosc2', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
