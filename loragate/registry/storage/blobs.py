"""What both artifact stores share: where a blob is keyed, the row a listing yields, the
streaming hash every read and write is checked with, and the typed errors a missing or
damaged blob becomes.

A blob is never trusted for being there: each store hashes what it writes before making it
visible and what it reads before handing it out, and reports a mismatch the same way
(``artifact_corrupted`` on the ``artifacts`` field) whichever store holds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from loragate.registry.digests import CHUNK, hex_of
from loragate.registry.errors import ErrorCode, IntegrityFailure


def blob_key(digest: str) -> str:
    """Where a blob lives under a store's root: ``blobs/sha256/ab/abcd...``; the two-letter
    fan-out keeps any one directory (or S3 listing page) small."""
    h = hex_of(digest)
    return f"blobs/sha256/{h[:2]}/{h}"


@dataclass(frozen=True)
class StoredBlob:
    """One blob as a store lists it (for ``loragate gc``, which keeps the young ones)."""

    digest: str
    size: int
    age_s: float


def missing_blob(digest: str, where: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"blob {digest} is missing from {where}", code=ErrorCode.ARTIFACT_CORRUPTED, field="artifacts"
    )


def corrupted_blob(digest: str, actual_hex: str, where: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"blob {digest} in {where} hashes to sha256:{actual_hex}: stored bytes are corrupted",
        code=ErrorCode.ARTIFACT_CORRUPTED,
        field="artifacts",
    )


def hash_stream(read: Callable[[int], bytes], sink: IO[bytes] | None = None) -> str:
    """The SHA-256 hex of everything ``read`` yields, copied to ``sink`` on the way: one
    pass both fetches and checks a blob."""
    h = hashlib.sha256()
    for chunk in iter(lambda: read(CHUNK), b""):
        h.update(chunk)
        if sink is not None:
            sink.write(chunk)
    return h.hexdigest()


def hash_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hash_stream(f.read)


def check_upload(digest: str, actual_hex: str) -> None:
    """The bytes about to be stored must be the blob their key names.

    Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when they hash to something else.
    """
    if actual_hex != hex_of(digest):
        raise corrupted_blob(digest, actual_hex, "the upload")
