"""Connecting to Temporal with the settings the `temporal` CLI uses.

Address, namespace, TLS and API key come from flags, else the environment variables and
config file the CLI reads (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_TLS_*``,
``TEMPORAL_API_KEY``, ``TEMPORAL_PROFILE``), via ``temporalio.envconfig``. Every client uses the
data converter (``activities.converter``: pydantic, with typed input errors).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime

from activities.converter import DATA_CONVERTER

__all__ = ["connect", "add_connection_args", "WORKFLOW_TASK_TIMEOUT"]

DEFAULT_ADDRESS = "127.0.0.1:7233"
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
"""Start-to-close bound of a TrainingRun's workflow tasks (Temporal's default is 10 s). A worker
that dies holding one delays the run by this much; our workflow tasks take milliseconds.
Every starter of ours passes it (``temporal workflow start --task-timeout 2s`` from the CLI)."""


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help=f"Temporal frontend host:port (env TEMPORAL_ADDRESS; default {DEFAULT_ADDRESS})")
    p.add_argument("--namespace", help="Temporal namespace (env TEMPORAL_NAMESPACE; default 'default')")


async def connect(address: str | None = None, namespace: str | None = None, runtime: Runtime | None = None) -> Client:
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    if address:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    if not config.get("target_host"):
        config["target_host"] = DEFAULT_ADDRESS
    if namespace:
        config["namespace"] = namespace
    if runtime is not None:
        config["runtime"] = runtime
    return await Client.connect(**config, data_converter=DATA_CONVERTER)
