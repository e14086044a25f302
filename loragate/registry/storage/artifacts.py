"""Content-addressed blob store: what the registry asks of one, and which one
``LORAGATE_ARTIFACTS`` names (a local directory or an S3 bucket).

Blobs are keyed by algorithm and digest (``blobs/sha256/ab/abcd...``) and never trusted
for already being there:

* a put of a blob that exists checks it first -- by hashing the file (local) or by the
  SHA-256 checksum S3 recorded when it was uploaded -- and rewrites it when it is
  corrupted or missing, so a register heals the store instead of reusing bad bytes;
* ``verify`` checks a blob without writing it (promotion does, before moving a pointer);
* every read re-hashes what it got and refuses bytes that do not match their key.

The interface and the factory live here; each store in a module of its own
(``local_store``, ``s3_store``), and what they share (keys, hashing, the integrity errors)
in ``blobs``. ``fetch_s3_bundle`` (a training job's bundle, not the store) is S3's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.settings import Settings
from loragate.registry.storage.blobs import StoredBlob
from loragate.registry.storage.local_store import LocalArtifactStore
from loragate.registry.storage.s3_store import S3ArtifactStore, s3_store_for
from loragate.registry.storage.scratch import Litter


class ArtifactStore(Protocol):
    """What the registry asks of a blob store; ``LocalArtifactStore`` and ``S3ArtifactStore``
    both answer it (structurally: neither imports this module)."""

    location: str

    def ensure(self) -> None:
        """Create the directory or bucket when missing."""
        ...

    def exists(self, digest: str) -> bool: ...

    def holds(self, digest: str) -> bool:
        """Present and known to match its digest, judged without fetching it; False when
        only the bytes could tell (a put with the bytes in hand then decides)."""
        ...

    def put_file(self, digest: str, path: Path) -> bool:
        """Store ``path`` under ``digest``; False when a verified copy was already there."""
        ...

    def put_bytes(self, digest: str, data: bytes) -> bool: ...

    def verify(self, digest: str) -> None:
        """Check the stored blob against its digest without fetching it when possible."""
        ...

    def fetch_to(self, digest: str, dest: Path) -> None:
        """Write the blob to ``dest`` after checking its digest."""
        ...

    def read_bytes(self, digest: str) -> bytes: ...

    def blobs(self) -> Iterator[StoredBlob]:
        """Every blob in the store (for ``loragate gc``)."""
        ...

    def delete(self, digest: str) -> None: ...

    def litter(self, max_age_s: float) -> list[Litter]:
        """Unfinished writes of gone or stale writers."""
        ...

    def remove_litter(self, litter: list[Litter]) -> int: ...


def open_artifact_store(settings: Settings) -> LocalArtifactStore | S3ArtifactStore:
    """The store ``LORAGATE_ARTIFACTS`` names: a directory, or ``s3://bucket/prefix``.

    Raises:
        InvalidInput: INVALID_SETTING for any other location.
    """
    location = settings.artifacts
    if location.startswith("s3://"):
        bucket, _, prefix = location[len("s3://") :].partition("/")
        if not bucket:
            raise InvalidInput(
                f"artifact location {location!r} names no bucket",
                code=ErrorCode.INVALID_SETTING,
                field="LORAGATE_ARTIFACTS",
            )
        return s3_store_for(settings, bucket, prefix)
    if "://" in location:
        raise InvalidInput(
            f"artifact location {location!r}: only a directory or s3://bucket/prefix is supported",
            code=ErrorCode.INVALID_SETTING,
            field="LORAGATE_ARTIFACTS",
        )
    return LocalArtifactStore(Path(location), litter_age_s=settings.litter_age_s)
