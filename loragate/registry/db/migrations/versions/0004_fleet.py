"""The serving fleet: vLLM replicas of each pinned base, by role.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("url", sa.String(512), primary_key=True),
        sa.Column("base_model_id", sa.String(64), nullable=False),
        sa.Column("base_model_commit", sa.String(80), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("adapter_dir", sa.Text, nullable=False),
        sa.Column("max_lora_rank", sa.Integer, nullable=False),
        sa.Column("max_loras", sa.Integer, nullable=False),
        sa.Column("served_model_name", sa.String(128), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(
            ["base_model_id", "base_model_commit"],
            ["base_models.base_model_id", "base_models.base_model_commit"],
            name="fk_replicas_base",
        ),
        sa.CheckConstraint("role IN ('canary', 'production')", name="ck_replicas_role"),
    )
    op.create_index("ix_replicas_base", "replicas", ["base_model_id", "role"])


def downgrade() -> None:
    op.drop_index("ix_replicas_base", table_name="replicas")
    op.drop_table("replicas")
