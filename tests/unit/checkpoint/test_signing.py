"""Signing (``cairn.checkpoint.signing``): a key variable that is set but empty is not signing off, a
key file must be a regular file, and one signer policy applies to every manifest read."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointOptions, read_manifest, write_checkpoint
from cairn.checkpoint.signing import Signer, signer_from_env
from cairn.stores import MemoryStore
from tests.conftest import refused_within_bounds

pytestmark = pytest.mark.usefixtures("no_signing_key")
"""The code under test signs and verifies only with the key a test configures itself."""


@pytest.mark.parametrize("name", ["CAIRN_SIGNING_KEY", "CAIRN_SIGNING_KEY_FILE"])
def test_set_but_empty_signing_variable_is_not_signing_off(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "")
    with pytest.raises(E.ConfigError) as info:
        signer_from_env()
    assert info.value.field == name


def test_unset_signing_variables_mean_no_signing() -> None:
    assert signer_from_env() is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-null-symlink"])
def test_signing_key_file_must_be_a_regular_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    path = tmp_path / "key"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    monkeypatch.setenv("CAIRN_SIGNING_KEY_FILE", str(path))
    err = refused_within_bounds(signer_from_env, E.ConfigError)
    assert "not a regular file" in str(err) and str(path) in str(err)


INFERENCE = CheckpointKind.INFERENCE


def test_every_manifest_read_verifies_the_signature_when_a_key_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore("signed")
    ref = write_checkpoint(
        store, CheckpointContent(kind=INFERENCE, run_id="s", step=1), {"w": np.ones(2)}, options=CheckpointOptions()
    ).ref
    read_manifest(store, ref, expect_kind=None)  # no key configured: fine
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "k" * 32)
    with pytest.raises(E.SignatureError):
        read_manifest(store, ref, expect_kind=None)  # the default reads the configured key
    signed = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="s", step=2), {"w": np.ones(2)}).ref
    assert read_manifest(store, signed, expect_kind=None).signature
    other = CheckpointOptions(signer=Signer(b"another key of 16+ bytes"))
    with pytest.raises(E.SignatureError):
        read_manifest(store, signed, expect_kind=None, options=other)
