"""The artifact store in a local directory (or any shared filesystem mounted as one).

Writes go to ``incoming/`` under a name of their own, are hashed as written, fsynced, made
read-only and renamed into place atomically: a reader never sees half a blob, and a writer
that dies leaves scratch that ``loragate gc`` sweeps. A put of a blob already there hashes
it first and rewrites it when damaged. Blobs this process has hashed are remembered by
their file's fingerprint, so the pointer-move path re-checks with one ``stat``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from loragate.registry.digests import CHUNK, hex_of, is_digest
from loragate.registry.storage.blobs import (
    StoredBlob,
    blob_key,
    check_upload,
    corrupted_blob,
    hash_file,
    hash_stream,
    missing_blob,
)
from loragate.registry.storage.scratch import Litter, find_litter, remove, scratch_name, sweep


def _fingerprint(path: str | Path) -> tuple[int, int, int, int]:
    """What changes whenever a file's bytes do: inode, size, mtime and ctime (which no user
    can set back), as git's index and rsync trust it."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class LocalArtifactStore:
    def __init__(self, root: Path, litter_age_s: float = 3600.0):
        self.root = Path(root)
        self.location = str(self.root)
        self.incoming = self.root / "incoming"
        self.litter_age_s = litter_age_s
        # blobs this process hashed and found good, by their file's fingerprint at the time:
        # a long-running worker re-checks with a stat, and re-hashes whatever changed since
        self._verified: dict[str, tuple[str, tuple[int, int, int, int]]] = {}

    def ensure(self) -> None:
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        return Path(self._file(digest))

    def _file(self, digest: str) -> str:
        # a plain string join: on the pointer-move path pathlib's operators cost more than the stat
        return os.path.join(self.location, blob_key(digest))

    def exists(self, digest: str) -> bool:
        return os.path.isfile(self._file(digest))

    def holds(self, digest: str) -> bool:
        return self._stored_hex(digest) == hex_of(digest)

    def _stored_hex(self, digest: str) -> str | None:
        """The stored blob's sha256 (its digest's hex when it is known good); None when missing."""
        known = self._verified.get(digest)
        path = known[0] if known else self._file(digest)
        try:
            before = _fingerprint(path)
            if known is not None and known[1] == before:
                return digest[len("sha256:") :]  # one stat: the pointer-move path
            actual = hash_file(path)
        except FileNotFoundError:
            return None
        if actual == hex_of(digest):
            self._verified[digest] = (path, before)
        return actual

    def _put(self, digest: str, write: Callable[[IO[bytes]], None]) -> bool:
        target = self._path(digest)
        if self._stored_hex(digest) == hex_of(digest):
            os.utime(target)  # in use again: not an orphan for gc's age check
            self._verified[digest] = (str(target), _fingerprint(target))
            return False
        # absent, or corrupted: (re)write it from the good bytes in hand
        self.incoming.mkdir(parents=True, exist_ok=True)
        sweep(self.incoming, self.litter_age_s)
        target.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: writers of the same blob in other threads must not collide
        fd, name = tempfile.mkstemp(prefix=scratch_name("incoming"), dir=self.incoming)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            check_upload(digest, hash_file(tmp))
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._verified[digest] = (str(target), _fingerprint(target))  # hashed just above, as written
        return True

    def put_file(self, digest: str, path: Path) -> bool:
        def write(f: IO[bytes]) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f, CHUNK)

        return self._put(digest, write)

    def put_bytes(self, digest: str, data: bytes) -> bool:
        def write(f: IO[bytes]) -> None:
            f.write(data)

        return self._put(digest, write)

    def verify(self, digest: str) -> None:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing or damaged.
        """
        actual = self._stored_hex(digest)
        if actual is None:
            raise missing_blob(digest, self.location)
        if actual != hex_of(digest):
            raise corrupted_blob(digest, actual, self.location)

    def fetch_to(self, digest: str, dest: Path) -> None:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing or its bytes do not match.
        """
        try:
            src = open(self._path(digest), "rb")  # noqa: SIM115 (closed below; missing is a typed error)
        except FileNotFoundError:
            raise missing_blob(digest, self.location) from None
        with src, open(dest, "wb") as out:
            actual = hash_stream(src.read, out)
        if actual != hex_of(digest):
            raise corrupted_blob(digest, actual, self.location)

    def read_bytes(self, digest: str) -> bytes:
        """Raises:
        IntegrityFailure: ARTIFACT_CORRUPTED when the blob is missing or its bytes do not match.
        """
        try:
            data = self._path(digest).read_bytes()
        except FileNotFoundError:
            raise missing_blob(digest, self.location) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != hex_of(digest):
            raise corrupted_blob(digest, actual, self.location)
        return data

    def blobs(self) -> Iterator[StoredBlob]:
        now = time.time()
        for path in (self.root / "blobs" / "sha256").glob("*/*"):
            digest = f"sha256:{path.name}"
            if is_digest(digest):
                st = path.stat()
                yield StoredBlob(digest, st.st_size, now - st.st_mtime)

    def delete(self, digest: str) -> None:
        self._path(digest).unlink(missing_ok=True)

    def litter(self, max_age_s: float) -> list[Litter]:
        return find_litter(self.incoming, max_age_s)

    def remove_litter(self, litter: list[Litter]) -> int:
        return remove(litter)
