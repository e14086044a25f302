"""Content-addressed blob store: a local directory or an S3 bucket.

Blobs are keyed by algorithm and digest (``blobs/sha256/ab/abcd...``), written once and
never modified. A put of bytes already present writes nothing; every read re-hashes what
it got and refuses bytes that do not match their key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from registry.digests import CHUNK, hex_of
from registry.errors import ErrorCode, IntegrityFailure, InvalidInput

MULTIPART_THRESHOLD = 8 << 20


def blob_key(digest: str) -> str:
    h = hex_of(digest)
    return f"blobs/sha256/{h[:2]}/{h}"


class ArtifactStore(Protocol):
    location: str

    def has(self, digest: str) -> bool: ...

    def put_file(self, digest: str, path: Path) -> bool:
        """Store ``path`` under ``digest``; False when it was already there."""
        ...

    def put_bytes(self, digest: str, data: bytes) -> bool: ...

    def fetch_to(self, digest: str, dest: Path) -> None:
        """Write the blob to ``dest`` after checking its digest."""
        ...

    def read_bytes(self, digest: str) -> bytes: ...


def _verify_file(digest: str, path: Path, where: str) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    if h.hexdigest() != hex_of(digest):
        raise IntegrityFailure(
            f"blob {digest} in {where} hashes to sha256:{h.hexdigest()}: stored bytes are corrupted",
            code=ErrorCode.ARTIFACT_CORRUPTED,
            field="artifacts",
        )


class _VerifiedReads:
    """``read_bytes`` through ``fetch_to``, so small reads are digest-checked too."""

    def read_bytes(self, digest: str) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            dest = Path(tmp) / "blob"
            self.fetch_to(digest, dest)
            return dest.read_bytes()


class LocalArtifactStore(_VerifiedReads):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.location = str(self.root)

    def ensure(self) -> None:
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        return self.root / blob_key(digest)

    def has(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def _put(self, digest: str, write) -> bool:
        target = self._path(digest)
        if target.is_file():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".incoming-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            _verify_file(digest, Path(tmp), "the upload")
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True

    def put_file(self, digest: str, path: Path) -> bool:
        def write(f):
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f, CHUNK)

        return self._put(digest, write)

    def put_bytes(self, digest: str, data: bytes) -> bool:
        return self._put(digest, lambda f: f.write(data))

    def fetch_to(self, digest: str, dest: Path) -> None:
        src = self._path(digest)
        if not src.is_file():
            raise IntegrityFailure(f"blob {digest} is missing from {self.location}", code=ErrorCode.ARTIFACT_CORRUPTED, field="artifacts")
        shutil.copyfile(src, dest)
        _verify_file(digest, dest, self.location)

class S3ArtifactStore(_VerifiedReads):
    """Blobs in ``s3://bucket/prefix``; boto3 switches to multipart above the threshold."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, multipart_threshold: int = MULTIPART_THRESHOLD):
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url)
        self.transfer = TransferConfig(multipart_threshold=multipart_threshold, multipart_chunksize=max(multipart_threshold, 5 << 20))

    def _key(self, digest: str) -> str:
        key = blob_key(digest)
        return f"{self.prefix}/{key}" if self.prefix else key

    def ensure(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                self.client.create_bucket(Bucket=self.bucket)
            else:
                raise

    def has(self, digest: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(digest))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def put_file(self, digest: str, path: Path) -> bool:
        if self.has(digest):
            return False
        _verify_file(digest, Path(path), "the upload")
        self.client.upload_file(str(path), self.bucket, self._key(digest), Config=self.transfer)
        return True

    def put_bytes(self, digest: str, data: bytes) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "blob"
            p.write_bytes(data)
            return self.put_file(digest, p)

    def fetch_to(self, digest: str, dest: Path) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.download_file(self.bucket, self._key(digest), str(dest), Config=self.transfer)
        except ClientError as e:
            raise IntegrityFailure(f"blob {digest} is missing from {self.location}: {e}", code=ErrorCode.ARTIFACT_CORRUPTED, field="artifacts")
        _verify_file(digest, dest, self.location)


def open_artifact_store(location: str, endpoint_url: str | None = None):
    if location.startswith("s3://"):
        rest = location[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise InvalidInput(f"artifact location {location!r} names no bucket", code=ErrorCode.INVALID_SETTING, field="LORAGATE_ARTIFACTS")
        return S3ArtifactStore(bucket, prefix, endpoint_url)
    if "://" in location:
        raise InvalidInput(f"artifact location {location!r}: only a directory or s3://bucket/prefix is supported", code=ErrorCode.INVALID_SETTING, field="LORAGATE_ARTIFACTS")
    return LocalArtifactStore(Path(location))
