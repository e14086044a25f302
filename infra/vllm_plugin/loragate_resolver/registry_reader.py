"""What a replica may serve, asked of the registry's database with a read-only credential.

The adapter volume is writable by the pools that materialize bundles (the canary pool
writes the index that also holds production's entries), so nothing on it can say which
bytes are good. The replica asks the registry instead: for one (adapter name, version) it
reads the version's three file digests and whether a replica of its role may serve it. A
volume writer can then make a load fail, never make a wrong one succeed.

Which versions a role may serve under the adapter's plain name (the switch loads before the
pointer move commits, so what is in flight must be servable too):

- production: the adapter's ``production`` or ``previous`` pointer (a rollback in flight),
  or a version with an ``approve`` code a person redeemed that no move has applied yet,
  within its lifetime counted from its redemption as the registry applies it (the promotion
  in flight: production takes only the canary, on a person's sign-off). A replica process
  started with ``LORAGATE_OWNER_MOVES`` (``replicas up --owner-moves``: tests, benchmarks,
  one machine) also serves the ``canary`` pointer: the registry's owner, or a person's own
  token, moves production in process with no code committed before the switch -- never on
  a fleet whose adapter volume the canary pool writes, since the canary pool chooses the
  canary. It is the process's own flag, never a file another process can write.
- canary: its ``canary``, ``production`` or ``previous`` pointer, a version production may
  serve, or any validated version (the canary promotion in flight): what the canary pool
  could serve through the database anyway.

Under its qualified name ``name@version`` (the live split's second version, ``routing``) a
version is served, on either role, only as ``name``'s own version and only while it is the
adapter's ``production`` or ``previous`` pointer, or its ``canary`` pointer with an active
canary window: what the split may send users to, and nothing else.

A version is served under its own adapter's name, or a name no adapter of the registry has
(a benchmark's probe), never under another adapter's name.

``routes`` reads the live split's table: each adapter's production version and its active
canary window (id, version, share, and the window's bucket secret, which keys each user's
bucket so that no client can compute which version it gets). ``routes_with_pins`` reads the
same on the same connection, and the adapters a person pinned (``adapter_pins``: the
production replicas keep them resident, ``engine_cache``). A registry without that table
(older than it) pins nothing; any other error reading it is returned beside the routes
(``pins_error``), so that a pin table the replica may not read never stops the routes.

Where the database is comes from the replica's secrets directory
(``LORAGATE_REPLICA_SECRETS_DIR``: ``registry-url``), read on every question, never from
the environment. SQLite is opened read-only; Postgres as the ``loragate_replica`` user,
which may read only these columns. Connect and statement are bounded; no decision is
cached (a name is asked about once per process and per switch): one connection, two or
three short queries per question.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import unquote

SECRETS_DIR_VARIABLE = "LORAGATE_REPLICA_SECRETS_DIR"
ADMIN_KEY_FILE = "admin-key"
REGISTRY_URL_FILE = "registry-url"
# the replica process's own flag (module docstring); never read from the secrets directory
OWNER_MOVES_VARIABLE = "LORAGATE_OWNER_MOVES"
TIMEOUT_S = 5
WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
MANIFEST_FILE = "manifest.json"

# one text per question for both dialects: "?" becomes psycopg's "%s". Each column is one the
# loragate_replica user is granted (migration 0010, REPLICA_GRANTS); COUNT(column), not
# COUNT(*), because column privileges do not cover "*"
QUERY = """
SELECT a.name, v.weights_sha256, v.adapter_config_sha256, v.manifest_sha256, v.stage,
       v.validation_status,
       (SELECT COUNT(p.stage) FROM stage_pointers p
         WHERE p.adapter_id = v.adapter_id AND p.version_id = v.version_id
           AND p.stage IN ('production', 'previous')),
       (SELECT COUNT(p.stage) FROM stage_pointers p
         WHERE p.adapter_id = v.adapter_id AND p.version_id = v.version_id AND p.stage = 'canary')
FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id
WHERE v.version_id = ?
"""
# a person's sign-offs redeemed for the version and not yet applied by a move: each good for
# its lifetime counted from its redemption, as the registry applies them (registry/db/sign_offs)
CODES_QUERY = """
SELECT c.issued_at, c.used_at, c.expires_at FROM approval_codes c
WHERE c.version_id = ? AND c.decision = 'approve' AND c.used_at IS NOT NULL AND c.applied_at IS NULL
"""

NAME_QUERY = "SELECT COUNT(a.id) FROM adapters a WHERE a.name = ?"
# a window counts only while its version is the adapter's canary pointer too: the registry ends
# a window in the move that takes its canary away, and a raw write that moved the pointer alone
# takes the version off the split all the same
ACTIVE_WINDOW = """canary_windows w
JOIN adapters a ON a.name = w.adapter_name
JOIN stage_pointers p ON p.adapter_id = a.id AND p.stage = 'canary' AND p.version_id = w.version_id
WHERE w.status IN ('open', 'ready')"""
# a version on an active canary window: the split answers its share of live traffic from it
WINDOW_QUERY = f"SELECT COUNT(w.id) FROM {ACTIVE_WINDOW} AND w.version_id = ?"
PRODUCTION_ROUTES_QUERY = """
SELECT a.name, p.version_id FROM stage_pointers p JOIN adapters a ON a.id = p.adapter_id
WHERE p.stage = 'production'
"""
WINDOW_ROUTES_QUERY = f"SELECT w.id, w.adapter_name, w.version_id, w.share, w.bucket_key FROM {ACTIVE_WINDOW}"
# the adapters a person pinned: the loragate_replica user is granted adapter_name alone
PINS_QUERY = "SELECT DISTINCT n.adapter_name FROM adapter_pins n ORDER BY n.adapter_name"
QUALIFIER = "@"


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


@dataclass(frozen=True)
class Permission:
    """What the registry lets a replica serve: the files' digests, and whether a pointer
    allows it (rather than a sign-off in flight, or validation alone on a canary replica)."""

    files: dict[str, str]
    by_pointer: bool


def owner_moves_here() -> bool:
    """Whether this replica process was started to serve the registry owner's in-process moves."""
    return os.environ.get(OWNER_MOVES_VARIABLE) == "1"


def expected_files(
    secrets_dir: str | None, role: str, name: str, version: str, owner_moves: bool | None = None
) -> dict[str, str]:
    """File name -> the hex SHA-256 the registry recorded (``servable``'s files)."""
    return servable(secrets_dir, role, name, version, owner_moves).files


def servable(
    secrets_dir: str | None, role: str, name: str, version: str, owner_moves: bool | None = None
) -> Permission:
    """The digests the registry recorded for a version a replica of ``role`` may serve under
    ``name``, and why it may. ``owner_moves``: None reads this process's flag.

    ``name`` may be qualified, ``adapter@version`` (module docstring): then ``version`` must
    be the one it names (``wrong_version``) and ``adapter``'s own.

    Raises:
        NotServable: no registry configured or reachable (``registry_unavailable``), no
            such version (``unknown_version``), another adapter's (``wrong_adapter``), a
            qualified name naming another version (``wrong_version``), or not one this role
            may serve now (``not_permitted``).
    """
    url = read_secret(secrets_dir, REGISTRY_URL_FILE)
    if url is None:
        raise NotServable(f"no {REGISTRY_URL_FILE} in the replica's secrets directory", "registry_unavailable")
    plain, sep, named_version = name.rpartition(QUALIFIER)
    if sep and named_version != version:
        raise NotServable(f"{name} names another version than {version}", "wrong_version")
    questions: list[tuple[str, object]] = [(QUERY, version), (CODES_QUERY, version)]
    if sep:
        questions.append((WINDOW_QUERY, version))
    rows, codes, *windows = _ask(url, questions)
    if not rows:
        raise NotServable(f"the registry has no version {version}", "unknown_version")
    adapter, weights, config, manifest, stage, validation, pointed, canary = rows[0]
    pointed, canary = int(pointed), int(canary)
    if sep and adapter != plain:
        raise NotServable(f"version {version} is {adapter}'s, not {plain}'s", "wrong_adapter")
    if not sep and adapter != name and int(_ask(url, [(NAME_QUERY, name)])[0][0][0]) > 0:
        raise NotServable(f"version {version} is {adapter}'s, not {name}'s", "wrong_adapter")
    if sep:
        allowed = by_pointer = may_serve_qualified(pointed, canary, int(windows[0][0][0]))
    else:
        code_expires = max((u for u in (_signed_off_until(*c) for c in codes) if u is not None), default=None)
        owner = owner_moves_here() if owner_moves is None else owner_moves
        allowed = may_serve(role, validation, pointed, canary, code_expires, owner)
        by_pointer = pointed > 0 or (canary > 0 and (role == "canary" or owner))
    if not allowed:
        raise NotServable(f"a {role} replica may not serve {name} = {version} ({stage})", "not_permitted")
    files = {WEIGHTS_FILE: weights, ADAPTER_CONFIG_FILE: config, MANIFEST_FILE: manifest}
    return Permission(files, by_pointer)


def may_serve_qualified(production_or_previous: int, canary: int, active_windows: int) -> bool:
    """``name@version``: production or previous, or the canary while its window is active."""
    return production_or_previous > 0 or (canary > 0 and active_windows > 0)


def routes(secrets_dir: str | None) -> tuple[list[tuple], list[tuple]]:
    """The live split's rows: (adapter name, production version) for every adapter with a
    production pointer, and (window id, adapter name, canary version, share, bucket secret)
    for every active canary window.

    Raises:
        NotServable: REGISTRY_UNAVAILABLE when there is no registry or it cannot be read.
    """
    url = read_secret(secrets_dir, REGISTRY_URL_FILE)
    if url is None:
        raise NotServable(f"no {REGISTRY_URL_FILE} in the replica's secrets directory", "registry_unavailable")
    production, windows = _ask(url, [(PRODUCTION_ROUTES_QUERY, ()), (WINDOW_ROUTES_QUERY, ())])
    return production, windows


@dataclass(frozen=True)
class RouteRows:
    """``routes``' rows, and the pinned adapters' names (None: not read, ``pins_error`` says why)."""

    production: list[tuple]
    windows: list[tuple]
    pins: list[str] | None
    pins_error: NotServable | None = None


def routes_with_pins(secrets_dir: str | None) -> RouteRows:
    """``routes`` and the pinned adapters, on one connection (module docstring).

    Raises:
        NotServable: REGISTRY_UNAVAILABLE when there is no registry or its routes cannot be
            read (the pins' own error is ``pins_error``, code ``pins_unreadable``).
    """
    url = read_secret(secrets_dir, REGISTRY_URL_FILE)
    if url is None:
        raise NotServable(f"no {REGISTRY_URL_FILE} in the replica's secrets directory", "registry_unavailable")
    with _session(url) as execute:
        production = execute(PRODUCTION_ROUTES_QUERY, ())
        windows = execute(WINDOW_ROUTES_QUERY, ())
        try:
            rows = execute(PINS_QUERY, ())
        except Exception as e:  # any driver's error: told apart below, never raised from here
            if _missing_table(e):
                return RouteRows(production, windows, [])
            state = getattr(e, "sqlstate", None)  # the driver's text may name the server: not kept
            described = f"{type(e).__name__} (SQLSTATE {state})" if state else type(e).__name__
            error = NotServable(f"the pinned adapters could not be read: {described}", "pins_unreadable")
            return RouteRows(production, windows, None, error)
    return RouteRows(production, windows, [str(name) for (name,) in rows if name])


def _missing_table(error: Exception) -> bool:
    """A table the query names does not exist: Postgres' SQLSTATE 42P01, SQLite's message."""
    if getattr(error, "sqlstate", None) == "42P01":
        return True
    return type(error).__name__ == "OperationalError" and "no such table" in str(error)


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


def _signed_off_until(issued: object, used: object, expires: object) -> datetime | None:
    issued_at, used_at, expires_at = _instant(issued), _instant(used), _instant(expires)
    if issued_at is None or used_at is None or expires_at is None:
        return None
    return used_at + (expires_at - issued_at)


def _ask(url: str, questions: list[tuple[str, object]]) -> list[list[tuple]]:
    """Each (query, its one parameter or a tuple of parameters)'s rows, on one read-only
    connection, bounded in time.

    Raises:
        NotServable: REGISTRY_UNAVAILABLE for an unsupported URL or any driver error.
    """
    with _session(url) as execute:
        return [execute(query, value) for query, value in questions]


@contextmanager
def _session(url: str) -> Iterator[Callable[[str, object], list[tuple]]]:
    """One read-only connection, bounded in time, as a function of (query, its parameters)
    -> rows. A driver error that leaves the block is NotServable (REGISTRY_UNAVAILABLE), as is
    an unsupported URL."""
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("sqlite", "postgresql", "postgres"):
        raise NotServable(f"{REGISTRY_URL_FILE} names an unsupported database ({scheme})", "registry_unavailable")
    try:
        if scheme == "sqlite":
            import sqlite3

            # SQLAlchemy's form: sqlite:////absolute/path or sqlite:///relative/path
            path = unquote(url.split(":///", 1)[-1].split("?", 1)[0])
            lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=TIMEOUT_S)
            try:
                yield lambda query, value: lite.execute(query, _params(value)).fetchall()
            finally:
                lite.close()
            return
        import psycopg

        conninfo = "postgresql:" + url.split(":", 1)[1]
        with psycopg.connect(
            conninfo,
            connect_timeout=TIMEOUT_S,
            options=f"-c statement_timeout={TIMEOUT_S * 1000} -c default_transaction_read_only=on",
            autocommit=True,  # one statement's error leaves the connection usable for the next
        ) as conn:
            yield lambda query, value: conn.execute(query.replace("?", "%s"), _params(value)).fetchall()
    except NotServable:
        raise
    except Exception as e:  # any driver's error: the answer is "not servable", never a 500
        raise NotServable(f"the registry could not be read: {type(e).__name__}", "registry_unavailable") from e


def _params(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)
