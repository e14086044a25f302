"""A canary window can end ``undecided``: over without the live requests its verdict needs.

A window whose traffic could not show whether the canary fails more often than production
(``rules/power.py``) -- a tenant with few users, a share the operator capped -- used to stay
"not ready" forever. It now ends ``undecided`` (its version withdrawn, unproven), a status
the database must accept and whose only way in is from ``open``: a ready window has been
decided, and a closed one never moves again. The status check gains the value, and on
Postgres the rules trigger of 0012 its move (the frozen ``WINDOW_MOVES`` below, as 0012
froze its own).

SQLite cannot alter a CHECK constraint, and rebuilding the table would turn 0011's column
constraint into a table-level one its downgrade cannot drop; so the table's stored
definition is rewritten in place, the procedure SQLite documents for loosening a CHECK
(every row meets the looser one). The downgrade first turns undecided windows into
``rolled_back`` ones (their versions were withdrawn; the reason says why), then tightens it
back the same way.

Revision ID: 0013
Revises: 0012
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op
from sqlalchemy import text

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# the end of the status check's list as 0005 wrote it, and as it is from here on
BEFORE = "'rolled_back', 'superseded')"
AFTER = "'rolled_back', 'superseded', 'undecided')"
STATUS_CHECK = "CHECK (status IN ('open', 'ready', 'promoted', 'rejected', {tail})"
# frozen copy of loragate.registry.rules.canary.WINDOW_MOVES at this revision
WINDOW_MOVES = (
    ("open", "ready"),
    ("open", "rolled_back"),
    ("open", "superseded"),
    ("open", "undecided"),
    ("ready", "promoted"),
    ("ready", "rejected"),
    ("ready", "rolled_back"),
    ("ready", "superseded"),
    ("promoted", "rolled_back"),
)
MOVES = ", ".join(f"('{a}', '{b}')" for a, b in WINDOW_MOVES)


def _revision(filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"loragate_migration_{filename[:4]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _window_rules(moves: str) -> str:
    """0012's trigger function with ``moves`` as the status moves it allows."""
    before = _revision("0012_who_sends_users_where.py")
    rules = before.WINDOW_RULES.replace(f"NOT IN ({before.MOVES})", f"NOT IN ({moves})")
    if moves != before.MOVES and rules == before.WINDOW_RULES:
        raise RuntimeError("0012's status moves were not found in its trigger function")
    return rules.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _sqlite_status_check(old: str, new: str) -> None:
    """Rewrite canary_windows' stored CHECK of its status from ``old`` to ``new``: SQLite's
    documented in-place change, within the migration's transaction."""
    conn = op.get_bind()
    definition = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'canary_windows'"))
    sql = definition.scalar_one()
    if sql.count(old) != 1:
        raise RuntimeError(f"canary_windows' status check is not the one this migration knows: {sql}")
    version = conn.execute(text("PRAGMA schema_version")).scalar_one()
    conn.execute(text("PRAGMA writable_schema = ON"))
    conn.execute(
        text("UPDATE sqlite_master SET sql = :sql WHERE type = 'table' AND name = 'canary_windows'"),
        {"sql": sql.replace(old, new)},
    )
    conn.execute(text(f"PRAGMA schema_version = {int(version) + 1}"))
    conn.execute(text("PRAGMA writable_schema = OFF"))


def _postgres_status_check(tail: str) -> None:
    op.execute("ALTER TABLE canary_windows DROP CONSTRAINT ck_canary_windows_status")
    op.execute(f"ALTER TABLE canary_windows ADD CONSTRAINT ck_canary_windows_status {STATUS_CHECK.format(tail=tail)}")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        _sqlite_status_check(BEFORE, AFTER)
        return
    _postgres_status_check(AFTER)
    op.execute(_window_rules(MOVES))


def downgrade() -> None:
    op.execute(
        "UPDATE canary_windows SET status = 'rolled_back', "
        "reason = 'undecided (migration 0013 downgraded): ' || coalesce(reason, '') WHERE status = 'undecided'"
    )
    if op.get_bind().dialect.name != "postgresql":
        _sqlite_status_check(AFTER, BEFORE)
        return
    op.execute(_window_rules(_revision("0012_who_sends_users_where.py").MOVES))
    _postgres_status_check(BEFORE)
