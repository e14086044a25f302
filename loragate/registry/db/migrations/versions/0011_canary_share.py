"""A canary window carries the share of the adapter's live requests its version answers.

``canary_windows.share`` (a fraction, 0 to 1, checked by the database) is what the vLLM
replicas' split reads for an active window; changing it while the window runs is a plain
compare-and-set of that column. On Postgres the replica's database user may read the few
columns the split needs (never the thresholds or reasons), and only the roles that already
move canary windows (``signing`` opens and watches them, ``activation`` promotes and rolls
back) may change the share; no role may write any other new column, since there is none.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# a column constraint, so SQLite can add it in place and drop the column again (its DROP
# COLUMN refuses a column named by a table-level CHECK)
ADD_SHARE = (
    "ALTER TABLE canary_windows ADD COLUMN share FLOAT NOT NULL DEFAULT 0 "
    "CONSTRAINT ck_canary_windows_share CHECK (share >= 0 AND share <= 1)"
)
# what a replica reads to split an adapter's traffic between production and its canary
REPLICA_GRANTS: tuple[str, ...] = ("SELECT (id, adapter_name, version_id, status, share) ON canary_windows",)
# who may change a running window's share: those that already move canary windows (0006)
SHARE_GRANTS: dict[str, tuple[str, ...]] = {
    "signing": ("UPDATE (share) ON canary_windows",),
    "activation": ("UPDATE (share) ON canary_windows",),
}


def _grants() -> list[tuple[str, str, str]]:
    """(privilege, table, database role) for every grant of this revision."""
    pairs = [("replica", g) for g in REPLICA_GRANTS] + [(r, g) for r, gs in SHARE_GRANTS.items() for g in gs]
    found = []
    for role, grant in pairs:
        privilege, table = grant.split(" ON ")
        found.append((privilege, table, f"loragate_{role}"))
    return found


def upgrade() -> None:
    op.execute(ADD_SHARE)
    if op.get_bind().dialect.name != "postgresql":
        return
    for privilege, table, role in _grants():
        op.execute(f"GRANT {privilege} ON {table} TO {role}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for privilege, table, role in _grants():
            op.execute(f"REVOKE {privilege} ON {table} FROM {role}")
    op.execute("ALTER TABLE canary_windows DROP COLUMN share")
