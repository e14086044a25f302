"""The resolver index files replicas read: one per adapter directory, replaced atomically,
naming by role each adapter's version, its immutable path and the SHA-256 of each file of
the bundle there (what the loragate vLLM resolver plugin answers from, and checks before it
hands vLLM a path). Built from the pure plan in ``loragate.registry.rules.fleet``.

Writers change one adapter's entries at a time (``replace_entries``), under an exclusive
lock on a file beside the index: a switch of one adapter and a reconcile of another never
write back each other's stale entries. The caller holds that adapter's row lock, so the
entries it writes agree with its pointers."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loragate.registry.rules.fleet import AdapterPointers, Replica, desired_placements

INDEX_FILE = ".loragate-index.json"
# 2: entries carry the bundle's file digests (the plugin serves no format-1 entry)
INDEX_FORMAT = 2
LOCK_FILE = ".loragate-index.lock"
# one adapter's entries by role; None removes the adapter from that role
Entries = dict[str, dict[str, Any] | None]
# a version id -> the hex SHA-256 of each file of its bundle (Registry.bundle_digests)
Digests = Callable[[str], Mapping[str, str]]


def index_entry(version_id: str, path: str, files: Mapping[str, str]) -> dict[str, Any]:
    """One adapter's entry for one role: the version, where its bundle is, what it hashes to."""
    return {"version": version_id, "path": path, "files": dict(files)}


def build_index(
    replicas: Iterable[Replica], adapters: list[AdapterPointers], digests: Digests
) -> dict[str, dict[str, Any]]:
    """The resolver index of each adapter directory: by role, adapter name -> entry."""
    indexes: dict[str, dict[str, Any]] = {}
    for replica in replicas:
        index = indexes.setdefault(replica.adapter_dir, {"format": INDEX_FORMAT, "roles": {}})
        entries = index["roles"].setdefault(replica.role.value, {})
        for name, placement in desired_placements(replica, adapters).items():
            entries[name] = index_entry(placement.version_id, placement.path, digests(placement.version_id))
    return indexes


def write_index(adapter_dir: str, index: Mapping[str, Any]) -> None:
    """Replace the directory's index at once: a resolver reads the old one or the new one."""
    directory = Path(adapter_dir)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".loragate-index-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / INDEX_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_index(adapter_dir: str) -> dict[str, Any]:
    """The directory's index; an empty one when there is none, it is unreadable, or it is
    of an older format (its entries carry no digests: reconcile writes them again)."""
    try:
        index = json.loads((Path(adapter_dir) / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        return {"format": INDEX_FORMAT, "roles": {}}
    return index


def adapter_entries(replicas: Iterable[Replica], adapter: AdapterPointers, digests: Digests) -> dict[str, Entries]:
    """What each adapter directory's index should say of one adapter, by role (None: nothing)."""
    entries: dict[str, Entries] = {}
    for replica in replicas:
        placement = desired_placements(replica, [adapter]).get(adapter.name)
        by_role = entries.setdefault(replica.adapter_dir, {})
        if placement is not None:
            by_role[replica.role.value] = index_entry(
                placement.version_id, placement.path, digests(placement.version_id)
            )
        else:
            by_role.setdefault(replica.role.value, None)
    return entries


@contextmanager
def _locked(adapter_dir: str) -> Iterator[None]:
    directory = Path(adapter_dir)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def replace_entries(adapter_dir: str, name: str, entries: Entries) -> Entries:
    """Set ``name``'s entries in the directory's index, role by role, leaving every other
    adapter's as they are; returns what they were (for a revert)."""
    with _locked(adapter_dir):
        index = read_index(adapter_dir)
        roles = index.setdefault("roles", {})
        before: Entries = {}
        for role, entry in entries.items():
            by_name = roles.setdefault(role, {})
            before[role] = by_name.get(name)
            if entry is None:
                by_name.pop(name, None)
            else:
                by_name[name] = entry
        write_index(adapter_dir, index)
    return before


def drop_unknown(adapter_dir: str, known: set[str]) -> None:
    """Remove the entries of adapters the registry does not know (none of them can be moving)."""
    with _locked(adapter_dir):
        index = read_index(adapter_dir)
        roles = index.setdefault("roles", {})
        if any(name not in known for by_name in roles.values() for name in by_name):
            for role, by_name in roles.items():
                roles[role] = {n: e for n, e in by_name.items() if n in known}
            write_index(adapter_dir, index)
