"""Numerics profiles: the one numerical implementation a run's bits are computed under.

numpy, OpenBLAS, PyTorch, MKL and oneDNN each pick their kernels by the CPU's features at
import time, so the same update computes other bits on an AVX2 and an AVX-512 machine. A
profile pins every such choice with the libraries' own controls, set in the environment
before numpy or torch is imported (``pin_environment``), and ``process_numerics`` checks, after
import, that the process really runs what its profile says. A profile's *id* adds a digest of
the library builds (numpy, OpenBLAS, torch, the C library): two processes with the same id
compute the same bits. The id is recorded in every checkpoint's lineage, workers poll a task
queue per id, and a bit-exact run resumes only under the id its checkpoint was computed under.

This module imports neither numpy nor torch at import time (it must run before them).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import cache
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from cairn.errors import NumericsProfileError, ProfileMismatchError

__all__ = [
    "PROFILES",
    "DEFAULT_PROFILE",
    "NATIVE",
    "NumericsProfile",
    "NumericsRecord",
    "pin_environment",
    "pinned_environment",
    "native_level",
    "effective_level",
    "process_numerics",
    "resumed_numerics",
    "profile_id",
    "profile_queue",
    "enter_profile",
    "process_profile_name",
    "NAMES",
    "ENV",
    "ProfileName",
]

ENV = "CAIRN_NUMERICS"
"""The profile a process runs under (set by ``pin_environment``; read as the default of
``--numerics``)."""
NATIVE = "native"
_LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
_NPY_TARGETS = ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR")
"""numpy 2.4's dispatch targets above its x86-64-v2 baseline, lowest first."""


@dataclass(frozen=True)
class NumericsProfile:
    """What decides the bits on a CPU, and the environment that pins it."""

    name: str
    level: str
    """The x86-64 micro-architecture level a machine needs to run it (psABI levels)."""
    numpy_disable: tuple[str, ...]
    """numpy SIMD dispatch targets switched off (``NPY_DISABLE_CPU_FEATURES``)."""
    openblas_kernel: str
    """OpenBLAS kernel (``OPENBLAS_CORETYPE``): its blocking and FMA use decide gemm's bits."""
    torch_capability: str
    """ATen's CPU kernels (``ATEN_CPU_CAPABILITY``)."""
    mkl: str
    """MKL's conditional numerical reproducibility branch (``MKL_CBWR``) and instruction ceiling."""
    onednn: str
    """oneDNN's instruction ceiling (``ONEDNN_MAX_CPU_ISA``), used by torch's CPU convolutions."""
    blas_threads: int = 1
    """OpenBLAS threads of the built-in trainer's numpy (torch's threads are the trainer's option)."""

    def environment(self) -> dict[str, str]:
        return {
            ENV: self.name,
            "NPY_DISABLE_CPU_FEATURES": " ".join(self.numpy_disable),
            "OPENBLAS_CORETYPE": self.openblas_kernel,
            "OPENBLAS_NUM_THREADS": str(self.blas_threads),
            "ATEN_CPU_CAPABILITY": self.torch_capability,
            "MKL_CBWR": self.mkl,
            "MKL_ENABLE_INSTRUCTIONS": self.mkl,
            "ONEDNN_MAX_CPU_ISA": self.onednn,
        }


PROFILES: dict[str, NumericsProfile] = {
    "x86-64-v2": NumericsProfile("x86-64-v2", "x86-64-v2", _NPY_TARGETS, "Nehalem", "default", "SSE4_2", "SSE41"),
    "x86-64-v3": NumericsProfile("x86-64-v3", "x86-64-v3", _NPY_TARGETS[1:], "Haswell", "avx2", "AVX2", "AVX2"),
    "x86-64-v4": NumericsProfile(
        "x86-64-v4", "x86-64-v4", _NPY_TARGETS[2:], "SkylakeX", "avx512", "AVX512", "AVX512_CORE"
    ),
}
DEFAULT_PROFILE = "x86-64-v3"
"""Every x86-64 CPU since 2013-2015 (Haswell, Zen) runs it, AVX-512 ones included, with AVX2 and
FMA kernels: the most widely runnable profile that keeps the vector units (see BENCHMARKS.md)."""
ProfileName = Literal["x86-64-v2", "x86-64-v3", "x86-64-v4", "native"]
NAMES: tuple[str, ...] = get_args(ProfileName)
"""``native``: Cairn pins nothing; the bits are those of the process's own dispatch (its id names
the level numpy dispatches to and the BLAS kernel, so a bit-exact resume on another kind of
machine is still refused, and segments stay on workers of the same kind)."""

# /proc/cpuinfo flags of each level (the x86-64 psABI), cumulative.
_LEVEL_FLAGS = {
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}


class NumericsRecord(BaseModel):
    """The numerics a state was computed under, as its lineage records it (provenance: not part
    of the fingerprint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(max_length=64)
    id: str = Field(max_length=128)
    """``PROFILE-DIGEST``: the profile and a digest of the library builds; equal ids, equal bits."""
    native: str = Field(max_length=64)
    """The native level of the machine that computed the state (what it could run)."""
    libraries: dict[str, str] = Field(default_factory=dict, max_length=16)
    mixed: list[str] = Field(default_factory=list, max_length=16)
    """Other profile ids earlier parts of this state were computed under (allowed only with the
    tolerance contract or ``--tolerance``): the state is no longer bit-exact to any one of them."""


def process_profile_name() -> str:
    """The profile this process was pinned to (``$CAIRN_NUMERICS``), else the default."""
    return os.environ.get(ENV) or DEFAULT_PROFILE


def check_name(name: str, field: str = "numerics") -> str:
    if name not in NAMES:
        raise NumericsProfileError(field, expected=f"one of {', '.join(NAMES)}", found=name)
    return name


def pinned_environment(name: str, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` with ``name``'s pinning controls set (``native``: Cairn sets none and leaves
    whatever ``base`` sets)."""
    check_name(name)
    env = dict(base)
    env[ENV] = name
    if name != NATIVE:
        env.update(PROFILES[name].environment())
    return env


def pin_environment(name: str, env: MutableMapping[str, str] = os.environ) -> None:
    """Set ``name``'s controls in this process's environment: call it before numpy or torch is
    imported (they read the controls once, at import); ``process_numerics`` checks it worked."""
    env.update(pinned_environment(name, env))


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def level_of_flags(flags: set[str]) -> str:
    """The highest x86-64 level whose flags (and every lower level's) are all present."""
    found = "x86-64"
    for level in _LEVELS:
        needed = set().union(*(_LEVEL_FLAGS[lv] for lv in _LEVELS[: _LEVELS.index(level) + 1]))
        if "abm" in needed and "abm" not in flags and "lzcnt" in flags:
            needed = (needed - {"abm"}) | {"lzcnt"}
        if needed <= flags:
            found = level
    return found


@cache
def native_level() -> str:
    """This machine's own level (``x86-64-v4`` on an AVX-512 Xeon), whatever the process pins."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return machine or "unknown"
    flags = _cpu_flags()
    return "x86-64-v2" if flags is None else level_of_flags(flags)


def effective_level() -> str:
    """The level numpy dispatches to in this process (after ``NPY_DISABLE_CPU_FEATURES``)."""
    features = importlib.import_module("numpy._core._multiarray_umath").__cpu_features__
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return native_level()
    if features.get("X86_V4"):
        return "x86-64-v4+" if features.get("AVX512_ICL") or features.get("AVX512_SPR") else "x86-64-v4"
    if features.get("X86_V3"):
        return "x86-64-v3"
    return "x86-64-v2"


@cache
def _blas() -> dict[str, str]:
    """OpenBLAS as numpy loaded it: version, the kernel it runs, its threads."""
    import numpy
    from threadpoolctl import threadpool_info

    home = os.path.dirname(os.path.dirname(numpy.__file__))
    found = [lib for lib in threadpool_info() if lib.get("internal_api") == "openblas"]
    # numpy's own copy (numpy.libs/), not another package's (scipy ships one too): load order varies
    found.sort(key=lambda lib: not str(lib.get("filepath", "")).startswith(os.path.join(home, "numpy")))
    if not found:
        return {"version": "none", "kernel": "none", "threads": "0"}
    lib = found[0]
    return {
        "version": str(lib.get("version")),
        "kernel": str(lib.get("architecture")),
        "threads": str(lib.get("num_threads")),
    }


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@cache
def libraries() -> dict[str, str]:
    """The library builds whose code computes a state (part of the profile id)."""
    libc, libc_version = platform.libc_ver()
    return {
        "machine": platform.machine(),
        "numpy": _version("numpy"),
        "openblas": _blas()["version"],
        "torch": _version("torch"),
        "libc": f"{libc} {libc_version}".strip() or "unknown",
    }


def profile_id(name: str, level: str | None = None) -> str:
    """``NAME-DIGEST`` of profile ``name`` with this install's libraries (``native`` adds the
    machine's effective level: its bits are that level's)."""
    check_name(name)
    body = dict(libraries(), profile=name)
    if name == NATIVE:
        body["level"] = level or effective_level()
        body["blas_kernel"] = _blas()["kernel"]
    digest = hashlib.sha256(repr(sorted(body.items())).encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def profile_queue(task_queue: str, numerics_id: str) -> str:
    """The task queue of the workers that run profile id ``numerics_id``: training segments of a
    run are routed there, so only a worker computing the run's bits ever trains it."""
    return f"{task_queue}~{numerics_id}"


def _problems(name: str) -> list[str]:
    """Why this process does not compute profile ``name``'s bits (empty: it does)."""
    if name == NATIVE:
        return []
    profile = PROFILES[name]
    native = native_level()
    if native not in _LEVELS or _LEVELS.index(native) < _LEVELS.index(profile.level):
        return [f"this machine is {native}, the profile needs {profile.level}"]
    problems = []
    level = effective_level()
    if level != profile.level:
        problems.append(f"numpy dispatches to {level} (NPY_DISABLE_CPU_FEATURES was not set before import)")
    blas = _blas()
    if blas["kernel"] not in ("none", profile.openblas_kernel):
        problems.append(f"OpenBLAS runs the {blas['kernel']} kernel, the profile {profile.openblas_kernel}")
    if blas["threads"] not in ("0", str(profile.blas_threads)):
        problems.append(f"OpenBLAS runs {blas['threads']} threads, the profile {profile.blas_threads}")
    if "torch" in sys.modules:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability()).lower()
        if capability != profile.torch_capability:
            problems.append(f"torch runs {capability.upper()} kernels, the profile {profile.torch_capability.upper()}")
    return problems


def process_numerics(name: str | None = None) -> NumericsRecord:
    """This process's numerics under profile ``name`` (default: ``$CAIRN_NUMERICS`` or the
    default profile), checked: a process that does not compute the profile's bits raises
    ``NumericsProfileError`` saying what differs."""
    name = check_name(name or process_profile_name())
    problems = _problems(name)
    if problems:
        raise NumericsProfileError(
            f"this process cannot compute under numerics profile {name}: {'; '.join(problems)} "
            f"(start it with `--numerics {name}` or CAIRN_NUMERICS={name} in its environment, on a machine "
            "that can run it)",
            field="numerics",
        )
    blas = _blas()
    libs = dict(libraries(), blas_kernel=blas["kernel"], blas_threads=blas["threads"])
    return NumericsRecord(profile=name, id=profile_id(name), native=native_level(), libraries=libs)


def resumed_numerics(
    recorded: NumericsRecord | None, current: NumericsRecord, *, exact: bool, where: str
) -> NumericsRecord:
    """The record of a state resumed from one computed under ``recorded`` by this process.

    A bit-exact resume (``exact``) under another profile id is refused: the bits would be those of
    no uninterrupted run. Otherwise the other id is kept in ``mixed``. A checkpoint that records
    no profile (written before profiles existed) is taken as computed under this one."""
    if recorded is None or recorded.id == current.id:
        mixed = [] if recorded is None else list(recorded.mixed)
        return current.model_copy(update={"mixed": mixed})
    if exact:
        differ = sorted(
            k
            for k in set(recorded.libraries) | set(current.libraries)
            if recorded.libraries.get(k) != current.libraries.get(k) and not k.startswith("blas_")
        )
        what = f"libraries differ: {', '.join(differ)}" if differ else f"{recorded.profile} vs {current.profile}"
        raise ProfileMismatchError(
            f"{where} was computed under numerics profile {recorded.id} and this process runs {current.id} "
            f"({what}): a bit-exact run resumes only under its own profile (run it with --numerics "
            f"{recorded.profile} on a matching install, or pass --tolerance to accept other bits)",
            field="lineage.numerics",
        )
    mixed = sorted({*recorded.mixed, recorded.id} - {current.id})[-16:]
    return current.model_copy(update={"mixed": mixed})


_REEXEC = "CAIRN_NUMERICS_REEXEC"


def enter_profile(name: str, *, reexec: bool) -> NumericsRecord:
    """Make this process compute under profile ``name`` for the rest of its life.

    When it does not (its libraries were imported without the controls) and ``reexec`` is allowed
    (a real command line, not a call from Python), the process replaces itself with the same
    command line under the pinned environment — once: a process that still cannot is refused."""
    name = check_name(name)
    try:
        record = process_numerics(name)
    except NumericsProfileError:
        if not reexec or os.environ.get(_REEXEC) == name or name in _unrunnable_here():
            raise
        env = pinned_environment(name)
        env[_REEXEC] = name
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    os.environ[ENV] = name
    return record


def _unrunnable_here() -> tuple[str, ...]:
    """Profiles no environment can fix on this machine (it lacks their level): no re-exec."""
    native = native_level()
    if native not in _LEVELS:
        return tuple(PROFILES)
    return tuple(n for n, p in PROFILES.items() if _LEVELS.index(p.level) > _LEVELS.index(native))
