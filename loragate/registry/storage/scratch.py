"""Scratch files and directories, and the litter crashed writers leave behind.

Every temporary thing loragate creates -- bundle snapshots and validation workspaces in
``$TMPDIR``, half-written blobs in the artifact store's ``incoming/``, fetches beside a
materialized bundle -- is named ``<prefix>-<host>-<pid>-<random>``. Normal exits and
SIGTERM remove them (the CLI turns SIGTERM into an exception, so ``finally`` runs); a
``kill -9`` cannot, so the next write sweeps what it finds: entries of a process on this
host that no longer runs, and anything older than the litter age whoever made it. An entry
of a live writer younger than that is never touched, which is what makes the sweep and
``loragate gc`` safe to run while others register.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIXES = ("loragate-", ".loragate-")


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def scratch_name(kind: str, *, hidden: bool = False) -> str:
    """The prefix of a scratch entry: whose it is, readable by ``is_litter``."""
    return f"{'.' if hidden else ''}loragate-{kind}-{_host_tag()}-{os.getpid()}-"


@contextlib.contextmanager
def scratch_dir(kind: str, base: Path | None = None, *, hidden: bool = False) -> Iterator[Path]:
    """A fresh directory removed on every exit path that runs Python (not ``kill -9``)."""
    path = Path(tempfile.mkdtemp(prefix=scratch_name(kind, hidden=hidden), dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _owner(name: str) -> tuple[str, int] | None:
    """(host tag, pid) of a scratch entry, or None when the name is not one of ours."""
    stem = name.lstrip(".")
    if not stem.startswith("loragate-"):
        return None
    parts = stem.split("-")
    # loragate-<kind>-<host>-<pid>-<random>; the kind has no dashes
    if len(parts) < 5 or not parts[3].isdigit():
        return None
    return parts[2], int(parts[3])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Litter:
    path: Path
    bytes: int
    age_s: float
    why: str  # "writer gone" or "older than the litter age"


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return path.lstat().st_size


def find_litter(directory: Path, max_age_s: float) -> list[Litter]:
    """Scratch entries in ``directory`` whose writer is gone or that are older than ``max_age_s``."""
    found = []
    host, now = _host_tag(), time.time()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        owner = _owner(entry.name)
        if owner is None:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
            path = Path(entry.path)
            if owner[0] == host and not _pid_alive(owner[1]):
                found.append(Litter(path, _size(path), age, "writer gone"))
            elif age > max_age_s:
                found.append(Litter(path, _size(path), age, "older than the litter age"))
        except FileNotFoundError:
            continue  # removed meanwhile by its writer or another sweep
    return found


def remove(litter: list[Litter]) -> int:
    """Remove what ``find_litter`` found; returns the bytes freed."""
    freed = 0
    for item in litter:
        try:
            if item.path.is_dir() and not item.path.is_symlink():
                shutil.rmtree(item.path)
            else:
                item.path.unlink()
            freed += item.bytes
        except FileNotFoundError:
            continue
    return freed


# a process sweeps a directory at most this often: a long-running worker writing many
# blobs pays for one scan a minute, a CLI process for one per command
SWEEP_INTERVAL_S = 60.0
_last_sweep: dict[str, float] = {}


def sweep(directory: Path, max_age_s: float) -> int:
    """Remove the litter in ``directory``; what a write does before it starts (once a
    ``SWEEP_INTERVAL_S`` per directory and process)."""
    key, now = str(directory), time.monotonic()
    if now - _last_sweep.get(key, -SWEEP_INTERVAL_S) < SWEEP_INTERVAL_S:
        return 0
    _last_sweep[key] = now
    return remove(find_litter(directory, max_age_s))
