"""Each loragate role's database user on Postgres (migration 0006; ``fleet`` since 0010):
what a work pool's worker connects as, so that the database itself refuses the writes its
role may not make, whatever code runs on that worker. The owner -- the user that creates
the tables and runs migrations -- is no worker's: it is subject to no grant, only to the
history triggers. SQLite has no users: whoever can open its file may write all of it, so on
SQLite the roles hold in the application alone.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from loragate.registry.rules.access import Role


def database_user(role: Role) -> str:
    return f"loragate_{role.value}"


def role_database_url(url: str, role: Role, password: str | None = None) -> str | None:
    """``url`` (the owner's) as ``role``'s database user, with ``password`` or none (a
    server that trusts local users); None for a database without users (SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    # built anew: URL.set(password=None) would keep the owner's password
    own = URL.create(
        parsed.drivername, database_user(role), password, parsed.host, parsed.port, parsed.database, parsed.query
    )
    return own.render_as_string(hide_password=False)
