"""The boto3 client an ``S3Store`` talks through: one per store, its settings read now.

- Credentials, region and endpoint come from boto3's standard chain; ``endpoint_url`` overrides
  it, and an explicit endpoint (an S3-compatible server) gets path-style addressing.
- botocore's own retries are off: ``cairn.stores.s3_retry`` is the one retry policy.
- Upload bodies are left out of the signature (``UNSIGNED-PAYLOAD``: no SHA-256 of every byte on
  the writer, 30% of an upload's CPU; 256 MiB to SeaweedFS 0.84 -> 0.59 CPU-s) only where
  botocore sends a checksum with each upload instead: ``request_checksum_calculation`` is
  ``when_supported`` (botocore's default), so each part and put carries a CRC32 (on http in a
  signed header; on https botocore already leaves bodies unsigned, the CRC32 in a trailer). With
  ``when_required`` (set for servers without checksum support) bodies stay signed as botocore
  signs them. A CRC32 catches corruption, not tampering: on plain http the BLAKE3 of every byte in
  the manifest, checked on every restore, is what refuses altered bytes.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config

__all__ = ["new_client"]

_LOADER = botocore.loaders.create_loader()
"""One botocore data loader for every client: it caches the parsed S3 service model, which a
fresh session would parse again (0.1-0.5 s of CPU per store opened, i.e. per activity)."""


def _s3_settings(core: botocore.session.Session, path_style: bool) -> dict[str, Any]:
    checksums = str(core.get_config_variable("request_checksum_calculation")).lower()
    return {
        **({"payload_signing_enabled": False} if checksums == "when_supported" else {}),
        **({"addressing_style": "path"} if path_style else {}),
    }


def new_client(endpoint_url: str | None, max_concurrency: int) -> Any:
    """An S3 client for a store whose uploads run ``max_concurrency`` parts at once."""
    core = botocore.session.Session()  # fresh: credentials and settings read now
    core.register_component("data_loader", _LOADER)
    overridden = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(
        retries={"mode": "standard", "total_max_attempts": 1},  # retried by s3_retry
        max_pool_connections=max(16, 2 * max_concurrency),
        connect_timeout=10,
        read_timeout=60,
        s3=_s3_settings(core, path_style=bool(overridden)),
    )
    return boto3.session.Session(botocore_session=core).client("s3", endpoint_url=endpoint_url, config=config)
