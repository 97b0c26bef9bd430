"""What the numbers were measured on: CPU, cores, memory, kernel, the temp dir's disk, the load
average at the start and the versions of the libraries that matter."""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
from typing import Any

import numpy as np


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    versions: dict[str, str] = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "safetensors", "blake3", "temporalio", "boto3"):
        with contextlib.suppress(Exception):
            versions[mod] = str(getattr(__import__(mod), "__version__", "?"))
    tmp = tempfile.gettempdir()
    disk = "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        best = ""
        for line in f:
            dev, mount, fstype = line.split()[:3]
            if tmp.startswith(mount) and len(mount) > len(best):
                best, disk = mount, f"{dev} ({fstype}) mounted at {mount}"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "kernel": platform.release(),
        "disk": disk,
        "loadavg_at_start": os.getloadavg(),
        "versions": versions,
    }
