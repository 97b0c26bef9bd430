"""Optional authenticity: HMAC-SHA256 over the manifest.

The manifest lists every tensor's checksum, so signing it covers every byte of the
checkpoint. When a key is configured (``CAIRN_SIGNING_KEY``, or a file named by
``CAIRN_SIGNING_KEY_FILE``), every commit is signed and every import without a valid
signature is refused. The content fingerprint never counts as proof: anyone can compute one.

Only an *unset* variable means "no signing": a variable that is set but empty is a mistake
(``CAIRN_SIGNING_KEY=`` from a template, an unexpanded secret) and is refused, never silently
read as signing off. The key file must be a regular file of at most 64 KiB.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cairn.errors import ConfigError, SignatureError
from cairn.jsonio import read_regular_file

__all__ = ["Signer", "signer_from_env", "SIGNATURE_PREFIX"]

SIGNATURE_PREFIX = "hmac-sha256:"
MAX_KEY_FILE_BYTES = 64 << 10


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
        if not hmac.compare_digest(self.sign(payload).encode(), signature.encode("utf-8", "surrogatepass")):
            raise SignatureError(
                "HMAC does not match the manifest (tampered, or signed with another key)",
                field="signature",
            )


def signer_from_env() -> Signer | None:
    """The configured signer, or None when neither variable is set (set but empty is refused)."""
    key = os.environ.get("CAIRN_SIGNING_KEY")
    key_file = os.environ.get("CAIRN_SIGNING_KEY_FILE")
    for name, value in (("CAIRN_SIGNING_KEY", key), ("CAIRN_SIGNING_KEY_FILE", key_file)):
        if value is not None and not value.strip():
            raise ConfigError(
                "set but empty: unset it to turn signing off",
                field=name,
                expected="a key of >= 16 bytes" if name == "CAIRN_SIGNING_KEY" else "a path to a key file",
                found=repr(value),
            )
    if key is not None:
        return Signer(key.encode())
    if key_file is not None:
        raw = read_regular_file(
            key_file, what="signing key file (CAIRN_SIGNING_KEY_FILE)", max_bytes=MAX_KEY_FILE_BYTES
        )
        return Signer(raw.strip())
    return None
