"""The resolver index files replicas read: one per adapter directory, replaced atomically,
naming by role each adapter's version and immutable path (what the loragate vLLM resolver
plugin answers from). Built from the pure plan in ``registry.rules.fleet``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from registry.rules.fleet import AdapterPointers, Replica, desired_placements

INDEX_FILE = ".loragate-index.json"
INDEX_FORMAT = 1


def build_index(replicas: Iterable[Replica], adapters: list[AdapterPointers]) -> dict[str, dict[str, Any]]:
    """The resolver index of each adapter directory: by role, adapter name -> version and path."""
    indexes: dict[str, dict[str, Any]] = {}
    for replica in replicas:
        index = indexes.setdefault(replica.adapter_dir, {"format": INDEX_FORMAT, "roles": {}})
        entries = index["roles"].setdefault(replica.role.value, {})
        for name, placement in desired_placements(replica, adapters).items():
            entries[name] = {"version": placement.version_id, "path": placement.path}
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
    try:
        return json.loads((Path(adapter_dir) / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"format": INDEX_FORMAT, "roles": {}}
