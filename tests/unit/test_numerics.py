"""Numerics profiles: what a profile pins, that a process computes under it, that its bits do not
depend on the machine's dispatch, and that a bit-exact resume under another profile is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointRef, latest_committed, list_checkpoints
from cairn.numerics import (
    DEFAULT_PROFILE,
    ENV,
    PROFILES,
    NumericsRecord,
    level_of_flags,
    pinned_environment,
    process_numerics,
    profile_queue,
    resumed_numerics,
)
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import REPO
from workers.cli.main import main

CONTROLS = tuple(PROFILES[DEFAULT_PROFILE].environment())
RESTRICTED = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"
"""An AVX2 or AVX-512 machine's numpy restricted to what a pre-AVX2 machine dispatches."""
V2_FLAGS = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
V3_FLAGS = V2_FLAGS | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}


def test_levels_from_cpu_flags() -> None:
    assert level_of_flags(set()) == "x86-64"
    assert level_of_flags(V2_FLAGS) == "x86-64-v2"
    assert level_of_flags(V3_FLAGS) == "x86-64-v3"
    assert level_of_flags((V3_FLAGS - {"abm"}) | {"lzcnt"}) == "x86-64-v3"  # some kernels say lzcnt
    assert level_of_flags(V3_FLAGS - {"fma"}) == "x86-64-v2"
    avx512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    assert level_of_flags(V3_FLAGS | avx512) == "x86-64-v4"
    assert level_of_flags(V2_FLAGS | avx512) == "x86-64-v2"  # levels are cumulative


def test_a_profile_pins_every_library_that_dispatches() -> None:
    env = pinned_environment("x86-64-v3", {"PATH": "/bin"})
    assert env["NPY_DISABLE_CPU_FEATURES"] == "X86_V4 AVX512_ICL AVX512_SPR"
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_CBWR"] == "AVX2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env[ENV] == "x86-64-v3" and env["PATH"] == "/bin"
    assert pinned_environment("native", {"PATH": "/bin"}) == {"PATH": "/bin", ENV: "native"}
    with pytest.raises(E.NumericsProfileError, match="numerics: expected one of x86-64-v2"):
        pinned_environment("avx2", {})


def test_this_test_process_computes_under_the_default_profile() -> None:
    record = process_numerics()
    assert record.profile == DEFAULT_PROFILE and record.id.startswith(f"{DEFAULT_PROFILE}-")
    assert record.libraries["blas_kernel"] == "Haswell" and record.libraries["blas_threads"] == "1"
    assert profile_queue("q", record.id) == f"q~{record.id}"
    with pytest.raises(E.NumericsProfileError, match="cannot compute under numerics profile x86-64-v2"):
        process_numerics("x86-64-v2")  # pinned to v3 at import: v2's bits are not what this process computes


# A fresh interpreter: what is under test is a process whose libraries were imported under an
# environment other than this one (unpinned, or numpy restricted to another machine's dispatch).
def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def _unpinned(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLS}
    return {**env, **extra}


def test_a_process_whose_libraries_were_imported_unpinned_is_refused() -> None:
    out = _python(
        "import numpy\nfrom cairn.numerics import process_numerics\nprocess_numerics('x86-64-v3')",
        _unpinned(NPY_DISABLE_CPU_FEATURES=RESTRICTED),
    )
    assert out.returncode != 0
    assert "NumericsProfileError: numerics: this process cannot compute under numerics profile x86-64-v3" in out.stderr
    assert "numpy dispatches to x86-64-v2" in out.stderr


# `cairn train` in a fresh process: its environment is the machine under test, and a profile other
# than this process's re-executes the command under it.
def _train(store: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "train", "--config", str(REPO / "examples" / "config.json"),
         "--store", str(store), "--steps", "30", "--json", *extra],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=180,
    )  # fmt: skip


def test_pinned_bits_do_not_depend_on_the_machines_dispatch_and_unpinned_ones_do(tmp_path: Path) -> None:
    """Two 'machines': this one, and this one with numpy restricted to pre-AVX2 dispatch. Under a
    profile they compute the same bits; with pinning off (``native``) they do not — the failure a
    pinned profile prevents, shown to be real on this very machine."""
    fingerprints = {}
    for name, profile in (("v2", "x86-64-v2"), ("native", "native")):
        for machine, env in (("here", _unpinned()), ("restricted", _unpinned(NPY_DISABLE_CPU_FEATURES=RESTRICTED))):
            out = _train(tmp_path / f"{name}-{machine}", env, "--numerics", profile)
            assert out.returncode == 0, out.stderr
            fingerprints[name, machine] = json.loads(out.stdout)["fingerprint"]
    assert fingerprints["v2", "here"] == fingerprints["v2", "restricted"]
    assert fingerprints["native", "here"] != fingerprints["native", "restricted"]


def test_a_bit_exact_resume_under_another_profile_is_refused_and_leaves_the_run_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    first = _train(store, _unpinned(), "--numerics", "x86-64-v2")
    assert first.returncode == 0, first.stderr
    ref = CheckpointRef.parse(json.loads(first.stdout)["checkpoint"])
    state, _ = load_training(LocalStore(store), ref)
    recorded = state.lineage.numerics
    assert recorded is not None and recorded.profile == "x86-64-v2" and recorded.mixed == []
    before = list_checkpoints(LocalStore(store), ref.run_id)

    with pytest.raises(E.ProfileMismatchError) as info:  # this process runs x86-64-v3
        TrainingSession.from_checkpoint(ref)
    message = str(info.value)
    assert recorded.id in message and process_numerics().id in message and "--tolerance" in message

    capsys.readouterr()
    code = main(["train", "--resume", str(ref), "--steps", "5", "--store", str(store)])  # this process: x86-64-v3
    refused = capsys.readouterr()
    assert code == 1 and refused.err.count("\n") == 1, refused.err
    assert refused.err.startswith("cairn: error: ProfileMismatchError: lineage.numerics: ")
    assert list_checkpoints(LocalStore(store), ref.run_id) == before  # nothing written

    session = TrainingSession.from_checkpoint(ref, tolerate_numerics=True)
    session.run(5)
    latest = latest_committed(LocalStore(store), ref.run_id)
    assert latest is not None and latest.step == ref.step + 5
    mixed, _ = load_training(LocalStore(store), latest)
    assert mixed.lineage.numerics is not None and mixed.lineage.numerics.mixed == [recorded.id]
    main(["ckpt", "show", str(latest)])
    shown = capsys.readouterr()
    assert f"MIXED with {recorded.id}" in shown.out, shown.out


def test_resumed_numerics_rules() -> None:
    here = NumericsRecord(profile="x86-64-v3", id="x86-64-v3-aaaa", native="x86-64-v4", libraries={"numpy": "2.4.6"})
    other = here.model_copy(update={"id": "x86-64-v3-bbbb", "libraries": {"numpy": "2.3.0"}})
    assert resumed_numerics(None, here, exact=True, where="c") == here  # written before profiles
    assert resumed_numerics(here, here, exact=True, where="c") == here
    with pytest.raises(E.ProfileMismatchError, match=r"c was computed under .*x86-64-v3-bbbb.*libraries differ: numpy"):
        resumed_numerics(other, here, exact=True, where="c")
    assert resumed_numerics(other, here, exact=False, where="c").mixed == ["x86-64-v3-bbbb"]
