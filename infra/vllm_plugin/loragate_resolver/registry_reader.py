"""What a replica may serve, asked of the registry's database with a read-only credential.

The adapter volume is writable by the pools that materialize bundles (the canary pool
writes the index that also holds production's entries), so nothing on it can say which
bytes are good. The replica asks the registry instead: for one (adapter name, version) it
reads the version's three file digests and whether a replica of its role may serve it. A
volume writer can then make a load fail, never make a wrong one succeed.

Which versions a role may serve (the switch loads before the pointer move commits, so
what is in flight must be servable too):

- production: the adapter's ``production`` or ``previous`` pointer (a rollback in flight),
  or a version with an ``approve`` code a person redeemed that no move has applied yet and
  that has not expired (the promotion in flight: production takes only the canary, on a
  person's sign-off). With the operator's ``owner-moves`` file also the ``canary`` pointer:
  the registry's owner, or a person's own token, moves production in process with no code
  committed before the switch (tests, benchmarks, one machine) -- never on a fleet whose
  adapter volume the canary pool writes, since the canary pool chooses the canary.
- canary: its ``canary``, ``production`` or ``previous`` pointer, a version production may
  serve, or any validated version (the canary promotion in flight): what the canary pool
  could serve through the database anyway.

A version is served under its own adapter's name, or a name no adapter of the registry has
(a benchmark's probe), never under another adapter's name.

Where the database is comes from the replica's secrets directory
(``LORAGATE_REPLICA_SECRETS_DIR``: ``registry-url``), read on every question, never from
the environment. SQLite is opened read-only; Postgres as the ``loragate_replica`` user,
which may read only these columns. Connect and statement are bounded; no decision is
cached (a name is asked about once per process and per switch).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from urllib.parse import unquote

SECRETS_DIR_VARIABLE = "LORAGATE_REPLICA_SECRETS_DIR"
ADMIN_KEY_FILE = "admin-key"
REGISTRY_URL_FILE = "registry-url"
OWNER_MOVES_FILE = "owner-moves"
TIMEOUT_S = 5
WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
MANIFEST_FILE = "manifest.json"

# one text for both dialects: "?" becomes psycopg's "%s". Each column is one the
# loragate_replica user is granted (migration 0010, REPLICA_GRANTS); COUNT(column), not
# COUNT(*), because column privileges do not cover "*"
QUERY = """
SELECT a.name, v.weights_sha256, v.adapter_config_sha256, v.manifest_sha256, v.stage,
       v.validation_status,
       (SELECT COUNT(p.stage) FROM stage_pointers p
         WHERE p.adapter_id = v.adapter_id AND p.version_id = v.version_id
           AND p.stage IN ('production', 'previous')),
       (SELECT COUNT(p.stage) FROM stage_pointers p
         WHERE p.adapter_id = v.adapter_id AND p.version_id = v.version_id AND p.stage = 'canary'),
       (SELECT MAX(c.expires_at) FROM approval_codes c
         WHERE c.version_id = v.version_id AND c.decision = 'approve'
           AND c.used_at IS NOT NULL AND c.applied_at IS NULL)
FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id
WHERE v.version_id = ?
"""

NAME_QUERY = "SELECT COUNT(a.id) FROM adapters a WHERE a.name = ?"


class NotServable(Exception):
    """The registry does not let this replica serve that version (``code`` says why)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def read_secret(secrets_dir: str | None, name: str) -> str | None:
    """A file of the replica's secrets directory, stripped; None when absent or empty."""
    if not secrets_dir:
        return None
    try:
        with open(os.path.join(secrets_dir, name), encoding="utf-8") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value or None


def expected_files(secrets_dir: str | None, role: str, name: str, version: str) -> dict[str, str]:
    """File name -> the hex SHA-256 the registry recorded, for a version a replica of
    ``role`` may serve under ``name``.

    Raises:
        NotServable: no registry configured or reachable (``registry_unavailable``), no
            such version (``unknown_version``), another adapter's (``wrong_adapter``), or
            not one this role may serve now (``not_permitted``).
    """
    url = read_secret(secrets_dir, REGISTRY_URL_FILE)
    if url is None:
        raise NotServable(f"no {REGISTRY_URL_FILE} in the replica's secrets directory", "registry_unavailable")
    try:
        row = _query(url, version)
    except NotServable:
        raise
    except Exception as e:  # any driver's error: the answer is "not servable", never a 500
        raise NotServable(f"the registry could not be read: {type(e).__name__}", "registry_unavailable") from e
    if row is None:
        raise NotServable(f"the registry has no version {version}", "unknown_version")
    adapter, weights, config, manifest, stage, validation, pointed, canary, code_expires = row
    if adapter != name and _is_an_adapter(url, name):
        raise NotServable(f"version {version} is {adapter}'s, not {name}'s", "wrong_adapter")
    owner_moves = read_secret(secrets_dir, OWNER_MOVES_FILE) is not None
    if not may_serve(role, validation, int(pointed), int(canary), _instant(code_expires), owner_moves):
        raise NotServable(f"a {role} replica may not serve {name} = {version} ({stage})", "not_permitted")
    return {WEIGHTS_FILE: weights, ADAPTER_CONFIG_FILE: config, MANIFEST_FILE: manifest}


def may_serve(
    role: str,
    validation: str,
    production_or_previous: int,
    canary: int,
    code_expires: datetime | None,
    owner_moves: bool,
    now: datetime | None = None,
) -> bool:
    """The rule in the module docstring, on what the query read."""
    now = now or datetime.now(UTC)
    allowed = production_or_previous > 0 or (code_expires is not None and code_expires > now)
    allowed = allowed or (owner_moves and canary > 0)
    if role == "canary":
        allowed = allowed or canary > 0 or validation == "passed"
    return allowed


def _instant(value: object) -> datetime | None:
    """A timestamp as either driver returns it (SQLite: text, naive meaning UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _is_an_adapter(url: str, name: str) -> bool:
    """Whether the registry has an adapter called ``name``: a version is served under its
    own adapter's name or a name no adapter has (a probe), never under another's."""
    try:
        row = _query(url, name, NAME_QUERY)
    except Exception as e:
        raise NotServable(f"the registry could not be read: {type(e).__name__}", "registry_unavailable") from e
    return row is not None and int(row[0]) > 0


def _query(url: str, value: str, query: str = QUERY) -> tuple | None:
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        import sqlite3

        # SQLAlchemy's form: sqlite:////absolute/path or sqlite:///relative/path
        path = unquote(url.split(":///", 1)[-1].split("?", 1)[0])
        lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=TIMEOUT_S)
        try:
            return lite.execute(query, (value,)).fetchone()
        finally:
            lite.close()
    if scheme in ("postgresql", "postgres"):
        import psycopg

        conninfo = "postgresql:" + url.split(":", 1)[1]
        with psycopg.connect(
            conninfo,
            connect_timeout=TIMEOUT_S,
            options=f"-c statement_timeout={TIMEOUT_S * 1000} -c default_transaction_read_only=on",
            autocommit=True,
        ) as conn:
            return conn.execute(query.replace("?", "%s"), (value,)).fetchone()
    raise NotServable(f"{REGISTRY_URL_FILE} names an unsupported database ({scheme})", "registry_unavailable")
