"""The materialized copies replicas load: checking their bytes, and setting a damaged one
aside.

A version's copy on a replica's adapter directory (``<dir>/<name>/<version>/``) is
immutable: its three files must hash to the digests the registry recorded at registration.
Checking is a full read, so what was checked is remembered per adapter directory, keyed by
each file's inode, size, mtime and ctime: a clean fleet is checked again by a few ``stat``
calls. Any write to a file (even one that restores its mtime) changes its ctime, which no
one but the kernel sets, so a tampered file is read again. The memory is kept under
loragate's own home (``<home>/verified-copies/``), never on the adapter volume: whoever can
write a copy there could also write a cache entry vouching for it.

A damaged copy is moved into ``.loragate-quarantine/`` (kept for whoever investigates,
never served: the resolver only trusts paths the index names) so the version can be
materialized afresh at its own path.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loragate.registry.digests import sha256_file

CACHE_DIR = "verified-copies"
QUARANTINE_DIR = ".loragate-quarantine"


def cache_file(home: str | Path, adapter_dir: str | Path) -> Path:
    """Where what was checked in ``adapter_dir`` is remembered, under loragate's ``home``."""
    key = hashlib.sha256(str(Path(adapter_dir).resolve()).encode()).hexdigest()[:24]
    return Path(home) / CACHE_DIR / f"{key}.json"


def stat_stamp(st: os.stat_result) -> list[int]:
    """What says a file is the one seen before: a rewrite in place changes its size or
    times, a replacement its inode."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclass
class VerifiedCache:
    """What was last found hashing each file of one adapter directory, by stat stamp, kept
    in ``path`` (``cache_file``)."""

    path: Path
    entries: dict[str, dict] = field(default_factory=dict)
    changed: bool = False
    hashed: int = 0  # files read in full this time (the cost a warm cache avoids)

    @classmethod
    def load(cls, path: Path) -> VerifiedCache:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries if isinstance(entries, dict) else {})

    def digest(self, path: Path) -> str | None:
        """The file's SHA-256, from the cache when its stamp is unchanged; None when it is
        missing or not a regular file."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        key = str(path)
        known = self.entries.get(key)
        if isinstance(known, dict) and known.get("stamp") == stat_stamp(st):
            return str(known.get("sha256"))
        found = sha256_file(path)
        self.hashed += 1
        self.entries[key] = {"stamp": stat_stamp(st), "sha256": found}
        self.changed = True
        return found

    def save(self) -> None:
        """Write the cache back atomically (a lost update costs only a re-read)."""
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.stem}-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.entries, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.changed = False


def damaged_files(copy: Path, expected: Mapping[str, str], cache: VerifiedCache) -> list[str]:
    """The files of ``copy`` that are missing or do not hash to ``expected`` (file -> hex
    SHA-256), sorted; empty when the copy verifies."""
    return sorted(name for name, digest in expected.items() if cache.digest(copy / name) != digest)


def quarantine(copy: Path, adapter_dir: str | Path) -> Path:
    """Move a damaged copy out of the path the index names, into the directory's
    quarantine; returns where it went."""
    relative = copy.resolve().relative_to(Path(adapter_dir).resolve())
    target = Path(adapter_dir) / QUARANTINE_DIR / f"{'__'.join(relative.parts)}-{time.time_ns()}"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(copy, target)
    return target
