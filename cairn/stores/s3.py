"""S3-compatible store (AWS S3, SeaweedFS, MinIO) over boto3.

- Credentials, region and endpoint come from boto3's standard chain (environment, profiles,
  ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``); ``endpoint_url`` overrides it.
- An object of at most ``part_size`` bytes (declared by ``size``, or found so when its chunks
  ran out) is one ``PutObject``. Larger objects go up as multipart uploads: parts are cut from
  the stream as it arrives and uploaded concurrently, with at most ``max_concurrency`` parts
  held in memory by the whole store (however many objects upload at once).
  ``abort_stale_uploads`` collects the uploads a crashed writer left behind.
- Reads are ranged GETs, issued concurrently and written straight into the caller's buffer.
- The commit is ``PutObject`` with ``If-None-Match: *`` (create-if-absent).
- Every request (a part, a ranged GET with its body, a commit, a listing page) goes through
  ``cairn.stores.s3_retry``: throttling (503 SlowDown, 429), server faults and broken
  connections are retried with capped exponential backoff and full jitter, and a process-wide
  bound caps the requests in flight. botocore's own retries are off, so that one policy is the
  whole story. A failed upload is aborted.

Every botocore error is translated to ``StorageError`` / ``ObjectNotFoundError`` in
``_translate``, the one edge where third-party errors enter Cairn.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, IncompleteReadError

from cairn.errors import ConfigError, ObjectNotFoundError, StorageError, StoreNotFoundError
from cairn.stores.base import Chunk, ObjectInfo, Store, split_key, too_large
from cairn.stores.s3_client import new_client
from cairn.stores.s3_retry import InflightLimit, RetryPolicy, call_with_retries, process_limit
from cairn.stores.s3_stream import fill_exactly, stream_spans

__all__ = ["S3Store"]

MiB = 1 << 20
T = TypeVar("T")
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_NO_STORE = {"NoSuchBucket": "no such bucket", "AccessDenied": "access denied",
             "InvalidAccessKeyId": "the access key is not known to the server",
             "SignatureDoesNotMatch": "the secret key does not match"}  # fmt: skip
_PRECONDITION = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409", "OperationAborted"}


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _NO_STORE:  # the same answer on every retry: fail fast, say what to fix
            raise StoreNotFoundError(
                f"{what}: {_NO_STORE[code]} (check the bucket name, the endpoint and the credentials)"
            ) from exc
        if code in _NOT_FOUND or status == 404:
            raise ObjectNotFoundError(f"{what}: not found") from exc
        raise StorageError(f"{what}: {code or status}: {exc}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"{what}: {exc}") from exc


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``; keys are relative to the prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any = None,
        part_size: int = 16 * MiB,
        max_concurrency: int = 8,
        part_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        inflight: InflightLimit | None = None,
    ) -> None:
        """``retry``: the backoff policy (default: ``RetryPolicy.from_env()``); ``part_attempts``
        overrides its attempts for multipart parts; ``inflight``: the bound on requests in flight
        (default: the process's, ``process_limit()``)."""
        if part_size < 5 * MiB:
            raise ConfigError("part_size", expected=">= 5 MiB (S3 minimum)", found=part_size)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.part_size = part_size
        self.read_piece_bytes = part_size  # one ranged GET per piece
        self.max_concurrency = max_concurrency
        self.retry = RetryPolicy.from_env() if retry is None else retry
        self.part_retry = self.retry if part_attempts is None else replace(self.retry, attempts=part_attempts)
        self.inflight = process_limit() if inflight is None else inflight
        self.client = new_client(endpoint_url, max_concurrency) if client is None else client
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="cairn-s3")
        self._lock = threading.Lock()
        # Parts in memory, for the whole store: shards upload concurrently, and a bound per
        # upload would let N shards hold N x max_concurrency parts.
        self._parts_in_flight = threading.BoundedSemaphore(max_concurrency)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        rest = url.removeprefix("s3://")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(field="store", expected="s3://bucket[/prefix]", found=url)
        return cls(bucket, prefix, **options)

    def _key(self, key: str) -> str:
        split_key(key)  # InvalidObjectError for '..', empty segments, NUL, line breaks
        return f"{self._base}{key}"

    def _call(self, request: Callable[[], T], retry: RetryPolicy | None = None) -> T:
        """One S3 request under the store's retry policy and the in-flight bound."""
        return call_with_retries(request, self.retry if retry is None else retry, self.inflight)

    @property
    def _base(self) -> str:
        """What the store's prefix adds in front of every key."""
        return f"{self.prefix}/" if self.prefix else ""

    # -- writes -------------------------------------------------------------------------------
    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        full, where = self._key(key), f"{self.url}/{key}"
        stream: Iterator[Chunk] = iter(chunks)
        if size is None or size <= self.part_size:
            head = bytearray()
            for chunk in stream:
                head += memoryview(chunk).cast("B")
                if len(head) > self.part_size:  # larger than announced: multipart after all
                    stream = itertools.chain([head], stream)
                    break
            else:
                put = functools.partial(self.client.put_object, Bucket=self.bucket, Key=full, Body=head)
                with _translate(f"put {where}"):
                    self._call(put)
                return
        self._multipart(full, stream, where)

    def _parts(self, chunks: Iterable[Chunk]) -> Iterator[bytearray]:
        """The stream cut into parts of ``part_size`` (the last may be shorter), each handed to
        its request as it was gathered: a part is copied once, not once more into ``bytes``."""
        buf = bytearray()
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                take = min(len(view), self.part_size - len(buf))
                buf += view[:take]
                view = view[take:]
                if len(buf) == self.part_size:
                    yield buf
                    buf = bytearray()
        if buf:
            yield buf

    def _upload_part(self, full: str, upload_id: str, number: int, body: bytes | bytearray) -> dict[str, Any]:
        resp = self._call(
            lambda: self.client.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body
            ),
            self.part_retry,
        )
        return {"PartNumber": number, "ETag": resp["ETag"]}

    def _multipart(self, full: str, chunks: Iterable[Chunk], where: str) -> None:
        with _translate(f"create multipart upload {where}"):
            created = self._call(lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=full))
            upload_id = created["UploadId"]
        in_flight = self._parts_in_flight
        futures: list[Future[dict[str, Any]]] = []
        try:
            with _translate(f"upload {where}"):
                for number, body in enumerate(self._parts(chunks), start=1):
                    in_flight.acquire()  # backpressure: at most max_concurrency parts in memory
                    fut = self._pool.submit(self._upload_part, full, upload_id, number, body)
                    fut.add_done_callback(lambda _f: in_flight.release())
                    futures.append(fut)
                parts = [f.result() for f in futures]
                if not parts:  # an empty object still needs one (empty) part
                    parts = [self._upload_part(full, upload_id, 1, b"")]
                done = {"Parts": parts}
                try:
                    self._call(
                        lambda: self.client.complete_multipart_upload(
                            Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload=done
                        )
                    )
                except ClientError as exc:
                    # A retried completion whose first answer was lost finds the upload gone:
                    # the object is complete iff it carries this upload's multipart ETag.
                    if str(exc.response.get("Error", {}).get("Code", "")) != "NoSuchUpload":
                        raise
                    if not self._completed_as(full, parts):
                        raise
                    return
        except BaseException:
            for f in futures:
                f.cancel()
            with contextlib.suppress(ClientError, BotoCoreError):
                self._call(lambda: self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id))
            raise

    def _completed_as(self, full: str, parts: list[dict[str, Any]]) -> bool:
        """Whether the object at ``full`` is the completion of exactly these parts (S3's multipart
        ETag: the MD5 of the parts' MD5s, then ``-N``)."""
        try:
            head = self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=full))
        except ClientError:
            return False
        digests = b"".join(bytes.fromhex(str(p["ETag"]).strip('"')) for p in parts)
        return str(head.get("ETag", "")).strip('"') == f"{hashlib.md5(digests).hexdigest()}-{len(parts)}"

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        for attempt in range(1, 6):
            try:
                self._call(lambda: self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*"))
                return True
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in _PRECONDITION or status == 412:
                    return False
                if (code in _CONFLICT or status == 409) and attempt < 5:
                    time.sleep(0.05 * attempt)  # a concurrent conditional write is in progress
                    continue
                with _translate(f"commit {self.url}/{key}"):
                    raise
            except BotoCoreError as exc:
                raise StorageError(f"commit {self.url}/{key}: {exc}") from exc
        raise StorageError(f"commit {self.url}/{key}: conditional write kept conflicting")

    # -- reads --------------------------------------------------------------------------------
    def read(self, key: str, max_bytes: int) -> bytes:
        full = self._key(key)

        def get() -> bytes:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                if int(response.get("ContentLength", 0)) > max_bytes:  # refused before the body is read
                    raise too_large(key, max_bytes, int(response["ContentLength"]))
                data: bytes = body.read(max_bytes + 1)
            finally:
                body.close()
            if len(data) > max_bytes:
                raise too_large(key, max_bytes, None)
            declared = response.get("ContentLength")
            if declared is not None and len(data) != int(declared):  # a body cut short: retried like a broken one
                raise IncompleteReadError(actual_bytes=len(data), expected_bytes=int(declared))
            return data

        with _translate(f"get {self.url}/{key}"):
            return self._call(get)

    def _read_range(self, full: str, offset: int, out: memoryview, where: str) -> None:
        def get() -> int:  # the range, a piece at a time; a body cut short is retried like a broken one
            span = f"bytes={offset}-{offset + len(out) - 1}"
            body = self.client.get_object(Bucket=self.bucket, Key=full, Range=span)["Body"]
            with contextlib.closing(body):
                found = fill_exactly(body, out)
            if found < len(out):
                raise IncompleteReadError(actual_bytes=found, expected_bytes=len(out))
            return found

        with _translate(f"get {where}"):
            found = self._call(get)
        if found != len(out):  # one byte more: the server ignored the range
            raise StorageError(field=where, expected=f"{len(out)} bytes at {offset}", found=f"{found} bytes")

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        view = out.cast("B") if out.format != "B" else out
        if not len(view):
            return
        full, where = self._key(key), f"{self.url}/{key}"
        ranges = [(start, min(len(view), start + self.part_size)) for start in range(0, len(view), self.part_size)]
        if len(ranges) == 1:
            self._read_range(full, offset, view, where)
            return
        futures = [self._pool.submit(self._read_range, full, offset + a, view[a:b], where) for a, b in ranges]
        for f in futures:
            f.result()

    def read_spans(
        self, key: str, offset: int, sizes: Sequence[int], buffer: memoryview
    ) -> Generator[memoryview, None, None]:
        """``Store.read_spans``: the spans with one ranged GET (``cairn.stores.s3_stream``)."""
        return stream_spans(self, key, offset, sizes, buffer)

    def open_range(self, key: str, offset: int, length: int) -> Any:
        """The body of a ranged GET of exactly ``length`` bytes at ``offset``, or None when the
        server answered with anything else (it ignored the range): ``s3_stream.SpanSource``."""
        full, where = self._key(key), f"{self.url}/{key}"
        span = f"bytes={offset}-{offset + length - 1}"
        with _translate(f"get {where}"):
            response = self._call(lambda: self.client.get_object(Bucket=self.bucket, Key=full, Range=span))
        body = response["Body"]
        if int(response.get("ContentLength", -1)) != length:
            body.close()
            return None
        return body

    def size(self, key: str) -> int:
        with _translate(f"head {self.url}/{key}"):
            full = self._key(key)
            return int(self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=full))["ContentLength"])

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """``Store.list``; ``start_after`` is S3's ``StartAfter``. SeaweedFS skips a whole
        "folder" whose path equals the bound (S3 lists the keys below it): pass bounds that name
        none, as ``cairn.checkpoint.layout.steps_after`` does."""
        base = self._base
        query: dict[str, str] = {"Bucket": self.bucket, "Prefix": base + prefix}
        if start_after is not None:
            query["StartAfter"] = base + start_after  # the server skips to it: no pages before
        while True:
            with _translate(f"list {self.url}/{prefix}"):
                page = self._call(functools.partial(self.client.list_objects_v2, **query))
            for obj in page.get("Contents", []):
                yield ObjectInfo(
                    key=obj["Key"][len(base) :],
                    size=int(obj["Size"]),
                    mtime=obj["LastModified"].timestamp(),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            query["ContinuationToken"] = token

    def delete(self, keys: Iterable[str]) -> None:
        batch: builtins.list[dict[str, str]] = []
        for key in keys:
            batch.append({"Key": self._key(key)})
            if len(batch) == 1000:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, batch: builtins.list[dict[str, str]]) -> None:
        with _translate(f"delete from {self.url}"):
            resp = self._call(
                lambda: self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            )
        errors = [e for e in resp.get("Errors", []) if e.get("Code") not in _NOT_FOUND]
        if errors:
            raise StorageError(f"delete from {self.url}: {errors[0].get('Code')}: {errors[0].get('Key')}")

    def _stale_uploads(
        self, prefix: str, older_than_seconds: float, now: float | None
    ) -> builtins.list[tuple[str, str]]:
        """(full key, upload id) of each multipart upload under ``prefix`` initiated
        ``older_than_seconds`` or more before ``now``."""
        now = time.time() if now is None else now

        def collect() -> builtins.list[tuple[str, str]]:  # retried whole: a failed page starts over
            stale: builtins.list[tuple[str, str]] = []
            # botocore's paginator, not hand-made markers: SeaweedFS pages by upload id alone.
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._base + prefix):
                for upload in page.get("Uploads", []):
                    if now - upload["Initiated"].timestamp() >= older_than_seconds:
                        stale.append((upload["Key"], upload["UploadId"]))
            return stale

        with _translate(f"list uploads {self.url}/{prefix}"):
            return self._call(collect)

    def stale_uploads(self, prefix: str, older_than_seconds: float, now: float | None = None) -> builtins.list[str]:
        """Keys of the multipart uploads under ``prefix`` initiated ``older_than_seconds`` or
        more before ``now``: what ``abort_stale_uploads`` would abort."""
        return [full[len(self._base) :] for full, _ in self._stale_uploads(prefix, older_than_seconds, now)]

    def abort_stale_uploads(
        self, prefix: str, older_than_seconds: float, now: float | None = None
    ) -> builtins.list[str]:
        """Abort the multipart uploads ``stale_uploads`` names; return their keys. An upload
        completed or aborted meanwhile (NoSuchUpload) is skipped."""
        aborted: builtins.list[str] = []
        # Collect first, abort after: aborting while paging could shift the markers.
        for full, upload_id in self._stale_uploads(prefix, older_than_seconds, now):
            try:
                with _translate(f"abort upload s3://{self.bucket}/{full}"):
                    abort = self.client.abort_multipart_upload
                    self._call(functools.partial(abort, Bucket=self.bucket, Key=full, UploadId=upload_id))
            except ObjectNotFoundError:
                continue
            aborted.append(full[len(self._base) :])
        return aborted

    def root_exists(self) -> bool:
        """The bucket exists and, with a prefix, holds at least one object under it."""
        try:
            with _translate(f"head bucket {self.bucket}"):
                self._call(lambda: self.client.head_bucket(Bucket=self.bucket))
        except (ObjectNotFoundError, StoreNotFoundError):
            return False
        if not self.prefix:
            return True
        with _translate(f"list {self.url}"):
            resp = self._call(
                functools.partial(self.client.list_objects_v2, Bucket=self.bucket, Prefix=f"{self.prefix}/", MaxKeys=1)
            )
        return bool(resp.get("KeyCount", 0))

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (dev stacks and tests)."""
        try:
            self._call(lambda: self.client.head_bucket(Bucket=self.bucket))
        except ClientError:
            with _translate(f"create bucket {self.bucket}"):
                self._call(lambda: self.client.create_bucket(Bucket=self.bucket))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
