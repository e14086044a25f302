"""What a replica holds, and who else holds any of it.

A replica's secrets directory (0700, files 0600; its path reaches the vLLM process in
``LORAGATE_REPLICA_SECRETS_DIR``, never the secrets): ``admin-key``, the fleet's key for the
replica's load and unload routes (the fleet-control pools hold it too: ``hand_admin_key``);
``registry-url``, the read-only credential the plugin asks the registry with; and
``feedback-key``, which seals the request ids the live split gives -- the replicas' alone.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from loragate.tasks.secret_files import ADMIN_KEY_FILE, FEEDBACK_KEY_FILE, REGISTRY_URL_FILE, REPLICA_ADMIN_KEY_FILE

REPLICA_SECRETS_VARIABLE = "LORAGATE_REPLICA_SECRETS_DIR"


def write_replica_secrets(
    directory: Path, admin_key: str, registry_url: str | None = None, *, feedback_key: str | None = None
) -> Path:
    """A replica's secrets directory (0700, files 0600): the fleet's admin key, the URL the
    plugin reads the registry with (SQLite: the file, opened read-only; Postgres as the
    ``loragate_replica`` user), and the key that seals request ids (``feedback_key``; None
    keeps the one there, or makes one: every replica of a fleet must hold the same). An
    existing directory is updated; a replica re-reads it on every question."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    if feedback_key is None:
        held = directory / FEEDBACK_KEY_FILE
        feedback_key = held.read_text().strip() if held.exists() else ""
        feedback_key = feedback_key or secrets.token_urlsafe(32)
    files = {ADMIN_KEY_FILE: admin_key, REGISTRY_URL_FILE: registry_url, FEEDBACK_KEY_FILE: feedback_key}
    for name, value in files.items():
        path = directory / name
        if value is None:
            path.unlink(missing_ok=True)
            continue
        # written beside and renamed over: a replica never reads half a file
        scratch = directory / f".{name}.tmp"
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(value)
        os.replace(scratch, path)
    return directory


# the work pools whose flows switch replicas (canary and production deploys, rollbacks,
# reconcile): only their workers hold the replicas' admin key (local/pipeline.POOLS)
FLEET_CONTROL_POOLS = ("canary", "release", "fleet")


def hand_admin_key(pool_secret_dirs: dict[str, Path], admin_key: str) -> None:
    """Put the replicas' admin key into the secrets directories of the fleet-control pools
    (``replica-admin-key``, 0600), and into no other pool's."""
    for pool in FLEET_CONTROL_POOLS:
        directory = pool_secret_dirs.get(pool)
        if directory is None:
            continue
        path = Path(directory) / REPLICA_ADMIN_KEY_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(admin_key)


def replica_registry_url(database_url: str) -> str:
    """The URL a replica reads the registry with: SQLite's file as it is, Postgres as the
    ``loragate_replica`` user (no password: a server that trusts local users; an operator
    with passwords writes the URL itself)."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        # absolute: the replica runs from another directory
        return url.set(database=str(Path(url.database or "").absolute())).render_as_string(hide_password=False)
    return url.set(username="loragate_replica", password=None).render_as_string(hide_password=False)
