"""Optional authenticity: HMAC-SHA256 over the manifest.

The manifest lists every tensor's checksum, so signing it covers every byte of the
checkpoint. When a key is configured (``CAIRN_SIGNING_KEY``, or a file named by
``CAIRN_SIGNING_KEY_FILE``), every commit is signed and every import without a valid
signature is refused. The content fingerprint never counts as proof: anyone can compute one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from cairn.errors import ConfigError, SignatureError

__all__ = ["Signer", "signer_from_env", "SIGNATURE_PREFIX"]

SIGNATURE_PREFIX = "hmac-sha256:"


class Signer:
    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigError("signing key", expected=">= 16 bytes", found=f"{len(key)} bytes")
        self._key = key

    def sign(self, payload: bytes) -> str:
        return SIGNATURE_PREFIX + hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    def verify(self, payload: bytes, signature: str | None) -> None:
        if not signature:
            raise SignatureError(
                "a signing key is configured and the manifest is unsigned",
                field="signature",
                expected="hmac-sha256:<64 hex>",
                found=None,
            )
        if not hmac.compare_digest(self.sign(payload), signature):
            raise SignatureError(
                "HMAC does not match the manifest (tampered, or signed with another key)",
                field="signature",
            )


def signer_from_env() -> Signer | None:
    """The configured signer, or None when no key is configured."""
    key = os.environ.get("CAIRN_SIGNING_KEY")
    key_file = os.environ.get("CAIRN_SIGNING_KEY_FILE")
    if key:
        return Signer(key.encode())
    if key_file:
        try:
            return Signer(Path(key_file).read_bytes().strip())
        except OSError as exc:
            raise ConfigError(f"CAIRN_SIGNING_KEY_FILE: cannot read {key_file}: {exc.strerror}") from exc
    return None
