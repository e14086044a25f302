"""Registry core: base catalog, adapters, immutable versions, stage pointers, audit log.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)

IMMUTABLE_VERSION_COLUMNS = (
    "adapter_id, content_address, identity_sha256, manifest_sha256, weights_sha256, "
    "weights_size, adapter_config_sha256, base_model_id, base_model_commit, lora_rank, manifest, "
    "created_at, created_by"
)


def upgrade() -> None:
    op.create_table(
        "base_models",
        sa.Column("base_model_id", sa.String(64), primary_key=True),
        sa.Column("base_model_commit", sa.String(80), primary_key=True),
        sa.Column("source_kind", sa.String(8), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("content_digest", sa.String(80), nullable=False),
        sa.Column("config_sha256", sa.String(64), nullable=False),
        sa.Column("config_raw_sha256", sa.String(64), nullable=False),
        sa.Column("rope_scaling", Json, nullable=True),
        sa.Column("tokenizer_revision", sa.String(80), nullable=False),
        sa.Column("transformers_version", sa.String(32), nullable=True),
        sa.Column("architecture", sa.String(128), nullable=True),
        sa.Column("module_shapes", Json, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(194), nullable=False, unique=True),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("base", sa.String(64), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_table(
        "adapter_versions",
        sa.Column("version_id", sa.String(64), primary_key=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), nullable=False),
        sa.Column("content_address", sa.String(80), nullable=False),
        sa.Column("identity_sha256", sa.String(64), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("weights_sha256", sa.String(64), nullable=False),
        sa.Column("weights_size", sa.BigInteger, nullable=False),
        sa.Column("adapter_config_sha256", sa.String(64), nullable=False),
        sa.Column("base_model_id", sa.String(64), nullable=False),
        sa.Column("base_model_commit", sa.String(80), nullable=False),
        sa.Column("lora_rank", sa.Integer, nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("validation_status", sa.String(16), nullable=False),
        sa.Column("previous_version", sa.String(64), nullable=True),
        sa.Column("manifest", Json, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.UniqueConstraint("adapter_id", "content_address", name="uq_adapter_versions_content"),
        sa.ForeignKeyConstraint(
            ["base_model_id", "base_model_commit"],
            ["base_models.base_model_id", "base_models.base_model_commit"],
            name="fk_adapter_versions_base",
        ),
    )
    op.create_index("ix_adapter_versions_adapter_created", "adapter_versions", ["adapter_id", "created_at"])
    op.create_table(
        "stage_pointers",
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), primary_key=True),
        sa.Column("stage", sa.String(16), primary_key=True),
        sa.Column("version_id", sa.String(64), sa.ForeignKey("adapter_versions.version_id"), nullable=False),
        sa.Column("moved_at", Timestamp, nullable=False),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("adapter_name", sa.String(194), nullable=True),
        sa.Column("version_id", sa.String(64), nullable=True),
        sa.Column("stage", sa.String(16), nullable=True),
        sa.Column("from_value", sa.String(64), nullable=True),
        sa.Column("to_value", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("details", Json, nullable=False),
    )
    op.create_index("ix_audit_events_adapter", "audit_events", ["adapter_name", "id"])

    # The audit log is append-only and a version's content never changes, whoever
    # holds a connection: enforced by the database, not only by this code.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION loragate_refuse_change() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION '% on %: % is immutable', TG_OP, TG_TABLE_NAME, TG_ARGV[0]; "
            "END; $$ LANGUAGE plpgsql"
        )
        op.execute(
            "CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
            "FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('the audit log')"
        )
        op.execute(
            "CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
            "FOR EACH STATEMENT EXECUTE FUNCTION loragate_refuse_change('the audit log')"
        )
        op.execute(
            f"CREATE TRIGGER adapter_versions_immutable BEFORE UPDATE OF {IMMUTABLE_VERSION_COLUMNS} "
            "ON adapter_versions FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('a version''s content')"
        )
    else:
        for op_name in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_events_no_{op_name.lower()} BEFORE {op_name} ON audit_events "
                "BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END"
            )
        op.execute(
            f"CREATE TRIGGER adapter_versions_immutable BEFORE UPDATE OF {IMMUTABLE_VERSION_COLUMNS} "
            "ON adapter_versions BEGIN SELECT RAISE(ABORT, 'a version''s content is immutable'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER adapter_versions_immutable ON adapter_versions")
        op.execute("DROP TRIGGER audit_events_no_truncate ON audit_events")
        op.execute("DROP TRIGGER audit_events_append_only ON audit_events")
        op.execute("DROP FUNCTION loragate_refuse_change()")
    else:
        op.execute("DROP TRIGGER adapter_versions_immutable")
        op.execute("DROP TRIGGER audit_events_no_delete")
        op.execute("DROP TRIGGER audit_events_no_update")
    op.drop_index("ix_audit_events_adapter", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_table("stage_pointers")
    op.drop_index("ix_adapter_versions_adapter_created", table_name="adapter_versions")
    op.drop_table("adapter_versions")
    op.drop_table("adapters")
    op.drop_table("base_models")
