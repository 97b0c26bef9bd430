"""LocalStore opens only the regular files it wrote: a FIFO, a device, a directory or a symlink
where an object should be is refused at once (never a hang, never an endless read), malformed
keys are refused as such, and listing skips what is not an object."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from cairn import errors as E
from cairn.stores import LocalStore, open_store
from tests.conftest import REPO

MANIFEST = "run/training/000000000004/manifest.json"


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    store.write_object("run/training/000000000004/shard-0.bin", [b"shard bytes"])
    return store


def _outcome_within(seconds: float, call: Callable[[], object], unblock: Callable[[], None]) -> object:
    """What ``call`` returned or raised, or fail (after ``unblock``) if it took longer."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(5)
        pytest.fail(f"store call blocked for more than {seconds} s")
    return outcome[0]


def _release_fifo(path: Path) -> Callable[[], None]:
    def release() -> None:  # a writer that opens and closes hands a blocked reader EOF
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    return release


def test_fifo_manifest_is_refused_without_blocking(store: LocalStore) -> None:
    fifo = store.root / MANIFEST
    os.mkfifo(fifo)
    for call in (
        lambda: store.read(MANIFEST, 1 << 30),
        lambda: store.read_into(MANIFEST, 0, memoryview(bytearray(4))),
        lambda: store.size(MANIFEST),
    ):
        outcome = _outcome_within(1.0, call, _release_fifo(fifo))
        assert isinstance(outcome, E.InvalidObjectError), outcome
        assert "FIFO" in str(outcome)


def _in_child(root: Path, key: str) -> dict[str, str]:
    """Read ``key`` in a child process with 512 MiB of address space and 20 s: a regression
    that reads a device forever fails there instead of exhausting this machine."""
    script = f"""
import json, resource
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
from cairn.stores import LocalStore
store, key, seen = LocalStore({str(root)!r}), {key!r}, {{}}
for name, call in [
    ("read", lambda: store.read(key, 1 << 30)),
    ("read_into", lambda: store.read_into(key, 0, memoryview(bytearray(64)))),
    ("size", lambda: store.size(key)),
]:
    try:
        seen[name] = "returned " + repr(call())[:40]
    except BaseException as exc:
        seen[name] = type(exc).__name__
print(json.dumps(seen))
"""
    # A child process: the address-space limit must not bind the test process itself.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_symlink_to_endless_device_is_refused(store: LocalStore, device: str) -> None:
    os.symlink(device, store.root / MANIFEST)
    assert _in_child(store.root, MANIFEST) == dict.fromkeys(("read", "read_into", "size"), "InvalidObjectError")


def test_symlink_out_of_the_store_is_refused(store: LocalStore, tmp_path: Path) -> None:
    secret = tmp_path / "outside.json"
    secret.write_text('{"not": "yours"}')
    os.symlink(secret, store.root / MANIFEST)
    for call in (
        lambda: store.read(MANIFEST, 1 << 30),
        lambda: store.read_into(MANIFEST, 0, memoryview(bytearray(4))),
        lambda: store.size(MANIFEST),
    ):
        with pytest.raises(E.InvalidObjectError, match="symlink"):
            call()
    assert MANIFEST not in {o.key for o in store.list("run/")}


def test_symlink_inside_the_store_is_refused(store: LocalStore) -> None:
    """Objects are regular files the store wrote: even a link to another object is refused."""
    os.symlink("shard-0.bin", store.root / MANIFEST)
    with pytest.raises(E.InvalidObjectError, match="symlink"):
        store.read(MANIFEST, 1 << 30)
    assert {o.key for o in store.list("run/")} == {"run/training/000000000004/shard-0.bin"}


def test_symlinked_directory_on_the_path_is_refused(store: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (outside / "000000000008").mkdir(parents=True)
    (outside / "000000000008" / "manifest.json").write_text("{}")
    os.symlink(outside, store.root / "run" / "inference")
    key = "run/inference/000000000008/manifest.json"
    with pytest.raises(E.InvalidObjectError, match="symlink"):
        store.read(key, 1 << 30)
    with pytest.raises(E.InvalidObjectError, match="symlink"):
        store.write_object(key, [b"{}"])
    assert (outside / "000000000008" / "manifest.json").read_text() == "{}"  # untouched
    assert list(store.list("run/inference/")) == []


def test_directory_where_an_object_should_be_is_refused(store: LocalStore) -> None:
    (store.root / MANIFEST).mkdir()
    for call in (
        lambda: store.read(MANIFEST, 1 << 30),
        lambda: store.read_into(MANIFEST, 0, memoryview(bytearray(4))),
        lambda: store.size(MANIFEST),
        lambda: store.exists(MANIFEST),
    ):
        with pytest.raises(E.InvalidObjectError, match="directory"):
            call()


def test_device_node_in_the_store_is_refused(store: LocalStore) -> None:
    try:
        os.mknod(store.root / MANIFEST, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # a copy of /dev/zero
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    with pytest.raises(E.InvalidObjectError, match="character device"):
        store.size(MANIFEST)
    assert _in_child(store.root, MANIFEST) == dict.fromkeys(("read", "read_into", "size"), "InvalidObjectError")


BAD_KEYS = ["", "/etc/passwd", "../escape", "run/../../escape", "run/./x", "run//x", "run/x/", "a\x00b", "a\nb"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_malformed_keys_are_invalid_not_retryable(store: LocalStore, key: str) -> None:
    for call in (
        lambda: store.read(key, 1 << 30),
        lambda: store.size(key),
        lambda: store.read_into(key, 0, memoryview(bytearray(1))),
        lambda: store.write_object(key, [b"x"]),
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.delete([key]),
    ):
        with pytest.raises(E.InvalidObjectError) as caught:
            call()
        assert not caught.value.retryable


def test_list_skips_looping_and_dangling_symlinks(store: LocalStore) -> None:
    step = store.root / "run" / "training" / "000000000004"
    os.symlink("loop", step / "loop")  # ELOOP on stat
    os.symlink("nowhere", step / "dangling")
    os.symlink(store.root, store.root / "run" / "training" / "cycle")  # a directory cycle
    os.mkfifo(step / "pipe")
    assert {o.key for o in store.list("run/")} == {"run/training/000000000004/shard-0.bin"}
    assert {o.key for o in store.list()} == {"run/training/000000000004/shard-0.bin"}


def test_list_prefix_cannot_leave_the_store(store: LocalStore) -> None:
    with pytest.raises(E.InvalidObjectError):
        list(store.list("../"))


def test_empty_root_is_a_config_error() -> None:
    with pytest.raises(E.ConfigError, match=r"store: expected a directory path or s3://bucket/prefix, found ''"):
        LocalStore("")
    with pytest.raises(E.ConfigError):
        open_store("")


def test_root_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(E.ConfigError, match="not a directory"):
        LocalStore(tmp_path / "file")


def test_local_store_has_no_stale_uploads(store: LocalStore) -> None:
    assert store.stale_uploads("run/", older_than_seconds=0) == []
    assert store.abort_stale_uploads("run/", older_than_seconds=0) == []
