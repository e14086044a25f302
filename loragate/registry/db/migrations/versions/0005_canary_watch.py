"""The canary watch: windows a canary must stay in band for, and their observations.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "canary_windows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("adapter_name", sa.String(194), nullable=False),
        sa.Column("version_id", sa.String(64), sa.ForeignKey("adapter_versions.version_id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("opened_at", Timestamp, nullable=False),
        sa.Column("thresholds", Json, nullable=False),
        sa.Column("closed_at", Timestamp, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("approval_flow_run_id", sa.String(64), nullable=True),
        sa.CheckConstraint(
            "status IN ('open', 'ready', 'promoted', 'rejected', 'rolled_back', 'superseded')",
            name="ck_canary_windows_status",
        ),
    )
    op.create_index("ix_canary_windows_status", "canary_windows", ["status"])
    op.create_index("ix_canary_windows_version", "canary_windows", ["version_id", "id"])
    op.create_table(
        "canary_observations",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("window_id", sa.Integer, sa.ForeignKey("canary_windows.id"), nullable=False),
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("observation", Json, nullable=False),
    )
    op.create_index("ix_canary_observations_window", "canary_observations", ["window_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_canary_observations_window", table_name="canary_observations")
    op.drop_table("canary_observations")
    op.drop_index("ix_canary_windows_version", table_name="canary_windows")
    op.drop_index("ix_canary_windows_status", table_name="canary_windows")
    op.drop_table("canary_windows")
