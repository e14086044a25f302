"""Approval codes: a production sign-off proves who gave it (``registry/rules/approvals.py``).

One row per issued code: what it decides on (a sign-off: the canary window, its version and
adapter; a rollback: no window, the version the stage served), the activation token it was
issued to and that token's holder (the reviewer), the decision, an expiry, and when and by
whom it was used (once). Only the SHA-256 of the code's secret is stored. On
Postgres every loragate role reads the table; only ``activation`` issues codes (never
choosing when they were used) and marks one used; nobody deletes one.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
ROLES = ("training", "signing", "activation", "admin")
ISSUED_COLUMNS = (
    "code_id, secret_sha256, window_id, version_id, adapter_name, token_id, reviewer, decision, issued_at, expires_at"
)


def upgrade() -> None:
    op.create_table(
        "approval_codes",
        sa.Column("code_id", sa.String(12), primary_key=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("window_id", sa.Integer, sa.ForeignKey("canary_windows.id"), nullable=True),
        sa.Column("version_id", sa.String(64), sa.ForeignKey("adapter_versions.version_id"), nullable=False),
        sa.Column("adapter_name", sa.String(194), nullable=False),
        sa.Column("token_id", sa.String(12), sa.ForeignKey("api_tokens.token_id"), nullable=False),
        sa.Column("reviewer", sa.String(128), nullable=False),
        sa.Column("decision", sa.String(8), nullable=False),
        sa.Column("issued_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("used_at", Timestamp, nullable=True),
        sa.Column("used_by", sa.String(128), nullable=True),
        sa.CheckConstraint("decision IN ('approve', 'reject', 'rollback')", name="ck_approval_codes_decision"),
    )
    op.create_index("ix_approval_codes_window", "approval_codes", ["window_id"])
    if op.get_bind().dialect.name == "postgresql":
        for role in ROLES:
            op.execute(f"GRANT SELECT ON approval_codes TO loragate_{role}")
        op.execute(f"GRANT INSERT ({ISSUED_COLUMNS}) ON approval_codes TO loragate_activation")
        op.execute("GRANT UPDATE (used_at, used_by) ON approval_codes TO loragate_activation")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for role in ROLES:
            op.execute(f"REVOKE ALL ON approval_codes FROM loragate_{role}")
    op.drop_index("ix_approval_codes_window", table_name="approval_codes")
    op.drop_table("approval_codes")
