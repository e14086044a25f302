"""Content digests, the formats of commits and digests, and canonical JSON.

A digest names its algorithm (``sha256:<hex>``) because the algorithm is part of its
identity. Canonical JSON (sorted keys, no whitespace, UTF-8, integral floats written as
integers, no NaN) makes a manifest hash the same whoever wrote the file. Every pattern a
digest or commit must match lives here, once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, BinaryIO

ALGORITHM = "sha256"
CHUNK = 1 << 20

# a bare sha256, as stored in the version columns (``weights_sha256``, ...)
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# a sha256 that names its algorithm: content addresses, blob keys, local base commits
SHA256_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# a Hugging Face hub commit
HF_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a git commit of the training code, abbreviated or full
GIT_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


def is_digest(value: str) -> bool:
    return bool(SHA256_DIGEST.match(value))


def is_revision(value: str) -> bool:
    """A pinned revision: a hub commit, or the sha256 content digest of local files."""
    return bool(HF_COMMIT.match(value) or SHA256_DIGEST.match(value))


def digest_of_hex(hexdigest: str) -> str:
    return f"{ALGORITHM}:{hexdigest}"


def hex_of(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return digest.split(":", 1)[1]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: stream.read(CHUNK), b""):
        h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def _canonical_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("canonical JSON has no NaN or Infinity")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        _canonical_value(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def canonical_sha256(value: Any) -> str:
    return sha256_bytes(canonical_json(value))
