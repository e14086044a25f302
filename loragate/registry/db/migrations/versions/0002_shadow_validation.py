"""Shadow validation: golden sets attached per adapter, and every validation run's report.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "golden_sets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("case_count", sa.Integer, nullable=False),
        sa.Column("attached_at", Timestamp, nullable=False),
        sa.Column("attached_by", sa.String(128), nullable=False),
    )
    op.create_index("ix_golden_sets_adapter", "golden_sets", ["adapter_id", "id"])
    op.create_table(
        "validation_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version_id", sa.String(64), sa.ForeignKey("adapter_versions.version_id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("golden_set_digest", sa.String(80), nullable=True),
        sa.Column("output_sha256", sa.String(64), nullable=True),
        sa.Column("report", Json, nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("finished_at", Timestamp, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
    )
    op.create_index("ix_validation_runs_version", "validation_runs", ["version_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_validation_runs_version", table_name="validation_runs")
    op.drop_table("validation_runs")
    op.drop_index("ix_golden_sets_adapter", table_name="golden_sets")
    op.drop_table("golden_sets")
