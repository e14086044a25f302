"""The artifact store in an S3 bucket (``s3://bucket/prefix``), and the download of a
training job's bundle from S3.

Every upload carries its SHA-256 checksum, which S3 checks on arrival and keeps: a put of a
blob already there, and ``verify``, compare that stored checksum instead of downloading the
bytes. Blobs over ``MULTIPART_THRESHOLD`` go up in parts, each with its own checksum, and
S3 then keeps a checksum of the part checksums; the whole is hashed before the upload is
completed, and an upload that fails is aborted (or, when the store is down, left for
``loragate gc``). Calls have bounded connect and read timeouts and a bounded number of
attempts; an unreachable store is a typed ``artifact_store_unavailable`` error, never a
traceback.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from loragate.registry.digests import hex_of, is_digest
from loragate.registry.errors import ErrorCode, IntegrityFailure, InvalidInput, Unavailable
from loragate.registry.settings import Settings
from loragate.registry.storage.blobs import (
    StoredBlob,
    blob_key,
    check_upload,
    corrupted_blob,
    hash_stream,
    missing_blob,
)
from loragate.registry.storage.scratch import Litter

MULTIPART_THRESHOLD = 8 << 20
MULTIPART_CHUNK = 8 << 20


def _b64(raw_digest: bytes) -> str:
    return base64.b64encode(raw_digest).decode()


def _composite(part_digests: list[bytes]) -> str:
    """S3's checksum of a multipart upload: the SHA-256 of the parts' SHA-256s."""
    return f"{_b64(hashlib.sha256(b''.join(part_digests)).digest())}-{len(part_digests)}"


def _same_checksum(stored: str | None, expected: str) -> bool:
    # real S3 writes a composite as "<b64>-<parts>"; moto leaves the suffix off
    return stored is not None and stored.split("-")[0] == expected.split("-")[0]


class S3ArtifactStore:
    """Blobs in ``s3://bucket/prefix``, uploaded with SHA-256 checksums S3 keeps and returns."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        *,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        multipart_chunk: int = MULTIPART_CHUNK,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_attempts: int = 3,
    ):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.multipart_threshold = multipart_threshold
        self.multipart_chunk = max(multipart_chunk, 5 << 20)  # S3's smallest part
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
                retries={"max_attempts": max_attempts, "mode": "standard"},
            ),
        )

    def _key(self, digest: str) -> str:
        key = blob_key(digest)
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextmanager
    def _calls(self, what: str) -> Iterator[None]:
        """Connection failures, timeouts and server errors become one typed error."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "?")
            raise Unavailable(
                f"artifact store {self.location}: {what} failed: {code}",
                code=ErrorCode.ARTIFACT_STORE_UNAVAILABLE,
                field="LORAGATE_ARTIFACTS",
            ) from e
        except BotoCoreError as e:
            raise Unavailable(
                f"artifact store {self.location} unreachable while {what}: {type(e).__name__}",
                code=ErrorCode.ARTIFACT_STORE_UNAVAILABLE,
                field="LORAGATE_S3_ENDPOINT_URL",
            ) from e

    def ensure(self) -> None:
        from botocore.exceptions import ClientError

        with self._calls("checking the bucket"):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                    raise
                self.client.create_bucket(Bucket=self.bucket)

    def _head(self, digest: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        with self._calls(f"reading {digest[:19]}"):
            try:
                return self.client.head_object(Bucket=self.bucket, Key=self._key(digest), ChecksumMode="ENABLED")
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise

    def exists(self, digest: str) -> bool:
        return self._head(digest) is not None

    def holds(self, digest: str) -> bool:
        head = self._head(digest)
        return head is not None and _same_checksum(head.get("ChecksumSHA256"), _b64(bytes.fromhex(hex_of(digest))))

    def _expected_checksum(self, digest: str, size: int, open_source: Callable[[], IO[bytes]]) -> str:
        """The checksum S3 holds for these bytes as this store uploads them."""
        if size <= self.multipart_threshold:
            return _b64(bytes.fromhex(hex_of(digest)))
        with open_source() as f:
            return _composite([hashlib.sha256(p).digest() for p in iter(lambda: f.read(self.multipart_chunk), b"")])

    def _put(self, digest: str, size: int, open_source: Callable[[], IO[bytes]]) -> bool:
        head = self._head(digest)
        if head is not None and _same_checksum(
            head.get("ChecksumSHA256"), self._expected_checksum(digest, size, open_source)
        ):
            return False
        # absent, written without a checksum, or corrupted: upload the good bytes in hand
        with open_source() as f:
            if size > self.multipart_threshold:
                self._multipart(digest, f)
                return True
            body = f.read()
        raw = hashlib.sha256(body).digest()
        check_upload(digest, raw.hex())
        with self._calls(f"uploading {digest[:19]}"):
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(digest),
                Body=body,
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=_b64(raw),
            )
        return True

    def _multipart(self, digest: str, source: IO[bytes]) -> None:
        key = self._key(digest)
        with self._calls(f"starting the upload of {digest[:19]}"):
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256")[
                "UploadId"
            ]
        try:
            whole, parts, digests = hashlib.sha256(), [], []
            for number, part in enumerate(iter(lambda: source.read(self.multipart_chunk), b""), start=1):
                whole.update(part)
                raw = hashlib.sha256(part).digest()
                digests.append(raw)
                with self._calls(f"uploading part {number} of {digest[:19]}"):
                    answer = self.client.upload_part(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=part,
                        ChecksumAlgorithm="SHA256",
                        ChecksumSHA256=_b64(raw),
                    )
                parts.append({"ETag": answer["ETag"], "PartNumber": number, "ChecksumSHA256": _b64(raw)})
            # the bytes sent must be the blob: checked before S3 makes them visible
            check_upload(digest, whole.hexdigest())
            with self._calls(f"completing the upload of {digest[:19]}"):
                done = self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
            stored = done.get("ChecksumSHA256") or (self._head(digest) or {}).get("ChecksumSHA256")
            if not _same_checksum(stored, _composite(digests)):
                raise corrupted_blob(digest, "(composite checksum differs)", self.location)
        except BaseException:
            self._abort(key, upload_id)
            raise

    def _abort(self, key: str, upload_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        # when the store is down the upload stays: gc aborts it once the store is back
        with contextlib.suppress(BotoCoreError, ClientError):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def put_file(self, digest: str, path: Path) -> bool:
        return self._put(digest, Path(path).stat().st_size, lambda: open(path, "rb"))

    def put_bytes(self, digest: str, data: bytes) -> bool:
        return self._put(digest, len(data), lambda: io.BytesIO(data))

    def verify(self, digest: str) -> None:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing, damaged, or carries no checksum.
        Unavailable: ARTIFACT_STORE_UNAVAILABLE when S3 cannot be reached.
        """
        head = self._head(digest)
        if head is None:
            raise missing_blob(digest, self.location)
        stored = head.get("ChecksumSHA256")
        if _same_checksum(stored, _b64(bytes.fromhex(hex_of(digest)))):
            return
        if stored is not None and head["ContentLength"] > self.multipart_threshold:
            # a multipart checksum covers the parts, not the digest: read the bytes instead
            actual = self._stream_hash(digest, None)
            if actual != hex_of(digest):
                raise corrupted_blob(digest, actual, self.location)
            return
        raise IntegrityFailure(
            f"blob {digest} in {self.location} does not carry its SHA-256 checksum: overwritten outside loragate",
            code=ErrorCode.ARTIFACT_CORRUPTED,
            field="artifacts",
        )

    def _stream_hash(self, digest: str, sink: IO[bytes] | None) -> str:
        from botocore.exceptions import ClientError

        with self._calls(f"downloading {digest[:19]}"):
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(digest))["Body"]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    raise missing_blob(digest, self.location) from None
                raise
            return hash_stream(body.read, sink)

    def fetch_to(self, digest: str, dest: Path) -> None:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing or its bytes do not match.
        Unavailable: ARTIFACT_STORE_UNAVAILABLE when S3 cannot be reached.
        """
        with open(dest, "wb") as out:
            actual = self._stream_hash(digest, out)
        if actual != hex_of(digest):
            raise corrupted_blob(digest, actual, self.location)

    def read_bytes(self, digest: str) -> bytes:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing or its bytes do not match.
        Unavailable: ARTIFACT_STORE_UNAVAILABLE when S3 cannot be reached.
        """
        sink = io.BytesIO()
        actual = self._stream_hash(digest, sink)
        if actual != hex_of(digest):
            raise corrupted_blob(digest, actual, self.location)
        return sink.getvalue()

    @property
    def _blobs_prefix(self) -> str:
        """Where every key this store writes lives; the rest of the bucket is someone else's."""
        return f"{self.prefix}/blobs/sha256/" if self.prefix else "blobs/sha256/"

    def blobs(self) -> Iterator[StoredBlob]:
        prefix = self._blobs_prefix
        now = time.time()
        with self._calls("listing blobs"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    digest = f"sha256:{obj['Key'].rsplit('/', 1)[-1]}"
                    if is_digest(digest):
                        yield StoredBlob(digest, obj["Size"], now - obj["LastModified"].timestamp())

    def delete(self, digest: str) -> None:
        with self._calls(f"deleting {digest[:19]}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(digest))

    def litter(self, max_age_s: float) -> list[Litter]:
        """This store's multipart uploads never completed nor aborted, older than
        ``max_age_s``. Only under its own prefix: a bucket shared with other stores or
        tools keeps their uploads in flight."""
        found = []
        now = time.time()
        prefix = self._blobs_prefix
        with self._calls("listing unfinished uploads"):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for upload in page.get("Uploads", []):
                    age = now - upload["Initiated"].timestamp()
                    # checked again: an S3 look-alike that ignores Prefix must not widen gc
                    if upload["Key"].startswith(prefix) and age > max_age_s:
                        path = Path(upload["Key"]) / upload["UploadId"]
                        found.append(Litter(path, 0, age, "unfinished multipart upload"))
        return found

    def remove_litter(self, litter: list[Litter]) -> int:
        for item in litter:
            if str(item.path.parent).startswith(self._blobs_prefix):
                self._abort(str(item.path.parent), item.path.name)
        return 0


def s3_store_for(settings: Settings, bucket: str, prefix: str) -> S3ArtifactStore:
    """An S3 client on ``bucket``/``prefix`` with the settings' endpoint and bounded waits."""
    return S3ArtifactStore(
        bucket,
        prefix,
        settings.s3_endpoint_url,
        connect_timeout_s=settings.s3_connect_timeout_s,
        read_timeout_s=settings.s3_read_timeout_s,
        max_attempts=settings.s3_max_attempts,
    )


def fetch_s3_bundle(settings: Settings, location: str, names: tuple[str, ...], dest: Path) -> None:
    """Download the files of a bundle at ``s3://bucket/prefix`` into ``dest`` (a training
    job's output, not the content-addressed store).

    Raises:
        InvalidInput: INVALID_BUNDLE for a location that is not s3://bucket/prefix or lacks a file.
        Unavailable: ARTIFACT_STORE_UNAVAILABLE when S3 cannot be reached.
    """
    from botocore.exceptions import ClientError

    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not location.startswith("s3://") or not bucket:
        raise InvalidInput(
            f"bundle location {location!r} is not s3://bucket/prefix", code=ErrorCode.INVALID_BUNDLE, field="bundle"
        )
    store = s3_store_for(settings, bucket, prefix)
    for name in names:
        key = f"{store.prefix}/{name}" if store.prefix else name
        with store._calls(f"downloading {key}"):
            try:
                store.client.download_file(bucket, key, str(dest / name))
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
                    raise
                raise InvalidInput(
                    f"bundle {location} has no {name}", code=ErrorCode.INVALID_BUNDLE, field="bundle"
                ) from e
