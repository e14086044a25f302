"""One active canary window per adapter, decided by the database: a partial unique index
on ``canary_windows(adapter_name)`` over the active statuses (open, ready).

Opening a window reads the active ones, supersedes them and inserts; two openings racing
on Postgres could both read none and both insert (4-5 OPEN windows for one version under 8
concurrent calls, issue 18). With the index the second insert fails and is retried, and
finds the first's window. Windows already doubled are settled first: all but the newest
active window of an adapter are superseded.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ACTIVE = "status IN ('open', 'ready')"


def upgrade() -> None:
    op.execute(
        "UPDATE canary_windows SET status = 'superseded', closed_at = CURRENT_TIMESTAMP, "
        "reason = 'a newer active window of the adapter (migration 0008)' "
        f"WHERE {ACTIVE} AND id NOT IN (SELECT max(id) FROM canary_windows WHERE {ACTIVE} GROUP BY adapter_name)"
    )
    op.create_index(
        "uq_canary_windows_one_active",
        "canary_windows",
        ["adapter_name"],
        unique=True,
        postgresql_where=sa.text(ACTIVE),
        sqlite_where=sa.text(ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_canary_windows_one_active", table_name="canary_windows")
