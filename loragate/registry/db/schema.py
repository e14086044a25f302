"""Table definitions the store queries with (SQLAlchemy Core).

Alembic migrations create these tables; this module never does. A test compares the
two so they cannot drift apart.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

# JSONB on Postgres, JSON text on SQLite
Json = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY
BigId = BigInteger().with_variant(Integer(), "sqlite")
Timestamp = DateTime(timezone=True)

base_models = Table(
    "base_models",
    metadata,
    Column("base_model_id", String(64), primary_key=True),
    Column("base_model_commit", String(80), primary_key=True),
    Column("source_kind", String(8), nullable=False),
    Column("source", Text, nullable=False),
    Column("content_digest", String(80), nullable=False),
    Column("config_sha256", String(64), nullable=False),
    Column("config_raw_sha256", String(64), nullable=False),
    Column("rope_scaling", Json, nullable=True),
    Column("tokenizer_revision", String(80), nullable=False),
    Column("transformers_version", String(32), nullable=True),
    Column("architecture", String(128), nullable=True),
    Column("module_shapes", Json, nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("created_by", String(128), nullable=False),
)

adapters = Table(
    "adapters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(194), nullable=False, unique=True),
    Column("namespace", String(64), nullable=False),
    Column("base", String(64), nullable=False),
    Column("task", String(64), nullable=False),
    # bumped by every pointer move: a compare-and-set guard against lost updates
    Column("revision", Integer, nullable=False, server_default="0"),
    Column("created_at", Timestamp, nullable=False),
)

adapter_versions = Table(
    "adapter_versions",
    metadata,
    Column("version_id", String(64), primary_key=True),
    Column("adapter_id", Integer, ForeignKey("adapters.id"), nullable=False),
    Column("content_address", String(80), nullable=False),
    Column("identity_sha256", String(64), nullable=False),
    Column("manifest_sha256", String(64), nullable=False),
    Column("weights_sha256", String(64), nullable=False),
    Column("weights_size", BigInteger, nullable=False),
    Column("adapter_config_sha256", String(64), nullable=False),
    Column("base_model_id", String(64), nullable=False),
    Column("base_model_commit", String(80), nullable=False),
    Column("lora_rank", Integer, nullable=False),
    Column("stage", String(16), nullable=False),
    Column("validation_status", String(16), nullable=False),
    Column("previous_version", String(64), nullable=True),
    Column("manifest", Json, nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("created_by", String(128), nullable=False),
    UniqueConstraint("adapter_id", "content_address", name="uq_adapter_versions_content"),
    ForeignKeyConstraint(
        ["base_model_id", "base_model_commit"],
        ["base_models.base_model_id", "base_models.base_model_commit"],
        name="fk_adapter_versions_base",
    ),
    Index("ix_adapter_versions_adapter_created", "adapter_id", "created_at"),
    # one linear chain per adapter (migration 0003): no fork, one first version
    Index(
        "uq_adapter_versions_previous",
        "previous_version",
        unique=True,
        sqlite_where=text("previous_version IS NOT NULL"),
        postgresql_where=text("previous_version IS NOT NULL"),
    ),
    Index(
        "uq_adapter_versions_first",
        "adapter_id",
        unique=True,
        sqlite_where=text("previous_version IS NULL"),
        postgresql_where=text("previous_version IS NULL"),
    ),
)

stage_pointers = Table(
    "stage_pointers",
    metadata,
    Column("adapter_id", Integer, ForeignKey("adapters.id"), primary_key=True),
    Column("stage", String(16), primary_key=True),
    Column("version_id", String(64), ForeignKey("adapter_versions.version_id"), nullable=False),
    Column("moved_at", Timestamp, nullable=False),
)

# the adapters every production replica keeps in a slot (0014): a person's (operator) or the
# traffic watch's (hot); the replicas read adapter_name
adapter_pins = Table(
    "adapter_pins",
    metadata,
    Column(
        "adapter_name",
        String(194),
        ForeignKey("adapters.name", ondelete="CASCADE", name="fk_adapter_pins_adapter"),
        primary_key=True,
    ),
    Column("source", String(16), nullable=False),
    Column("pinned_by", String(128), nullable=False),
    Column("pinned_at", Timestamp, nullable=False, server_default=func.now()),
    CheckConstraint("source IN ('operator', 'hot')", name="ck_adapter_pins_source"),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", Timestamp, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("action", String(32), nullable=False),
    Column("adapter_name", String(194), nullable=True),
    Column("version_id", String(64), nullable=True),
    Column("stage", String(16), nullable=True),
    Column("from_value", String(64), nullable=True),
    Column("to_value", String(64), nullable=True),
    Column("reason", Text, nullable=True),
    Column("details", Json, nullable=False),
    Index("ix_audit_events_adapter", "adapter_name", "id"),
)

golden_sets = Table(
    "golden_sets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("adapter_id", Integer, ForeignKey("adapters.id"), nullable=False),
    Column("digest", String(80), nullable=False),
    Column("case_count", Integer, nullable=False),
    Column("attached_at", Timestamp, nullable=False),
    Column("attached_by", String(128), nullable=False),
    Index("ix_golden_sets_adapter", "adapter_id", "id"),
)

replicas = Table(
    "replicas",
    metadata,
    Column("url", String(512), primary_key=True),
    Column("base_model_id", String(64), nullable=False),
    Column("base_model_commit", String(80), nullable=False),
    Column("role", String(16), nullable=False),
    Column("adapter_dir", Text, nullable=False),
    Column("max_lora_rank", Integer, nullable=False),
    Column("max_loras", Integer, nullable=False),
    Column("served_model_name", String(128), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("created_by", String(128), nullable=False),
    ForeignKeyConstraint(
        ["base_model_id", "base_model_commit"],
        ["base_models.base_model_id", "base_models.base_model_commit"],
        name="fk_replicas_base",
    ),
    CheckConstraint("role IN ('canary', 'production')", name="ck_replicas_role"),
    Index("ix_replicas_base", "base_model_id", "role"),
)

validation_runs = Table(
    "validation_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("version_id", String(64), ForeignKey("adapter_versions.version_id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("golden_set_digest", String(80), nullable=True),
    Column("output_sha256", String(64), nullable=True),
    Column("report", Json, nullable=False),
    Column("started_at", Timestamp, nullable=False),
    Column("finished_at", Timestamp, nullable=False),
    Column("actor", String(128), nullable=False),
    Index("ix_validation_runs_version", "version_id", "id"),
)

canary_windows = Table(
    "canary_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("adapter_name", String(194), nullable=False),
    Column("version_id", String(64), ForeignKey("adapter_versions.version_id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("opened_at", Timestamp, nullable=False),
    Column("thresholds", Json, nullable=False),
    Column("closed_at", Timestamp, nullable=True),
    Column("reason", Text, nullable=True),
    Column("approval_flow_run_id", String(64), nullable=True),
    # the fraction of the adapter's live requests the window's version answers (0011)
    Column("share", Float, nullable=False, server_default=text("0")),
    # the secret the replicas key each user's bucket with (0012); never leaves the database
    # through the application: window_from_row does not read it
    Column("bucket_key", String(64), nullable=False),
    CheckConstraint(
        "status IN ('open', 'ready', 'promoted', 'rejected', 'rolled_back', 'superseded', 'undecided')",
        name="ck_canary_windows_status",
    ),
    CheckConstraint("share >= 0 AND share <= 1", name="ck_canary_windows_share"),
    Index("ix_canary_windows_status", "status"),
    Index("ix_canary_windows_version", "version_id", "id"),
    # one active window per adapter (migration 0008): the database decides a race to open one
    Index(
        "uq_canary_windows_one_active",
        "adapter_name",
        unique=True,
        postgresql_where=text("status IN ('open', 'ready')"),
        sqlite_where=text("status IN ('open', 'ready')"),
    ),
)

# the registry's own limits, one row the owner writes from the settings (0012): what the
# database's rules read, never the environment
registry_limits = Table(
    "registry_limits",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("canary_max_share", Float, nullable=False),
    # the thresholds a window opened by a role's user is held to (0015); none: the opener's
    Column("canary_thresholds", Json, nullable=True),
    # the most pins of a base a hot pin may join (0016); none: no hot pin
    Column("hot_pins", Integer, nullable=True),
    CheckConstraint("id = 1", name="ck_registry_limits_one_row"),
    CheckConstraint("canary_max_share >= 0 AND canary_max_share <= 1", name="ck_registry_limits_canary_max_share"),
)

canary_observations = Table(
    "canary_observations",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("window_id", Integer, ForeignKey("canary_windows.id"), nullable=False),
    Column("at", Timestamp, nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("observation", Json, nullable=False),
    Index("ix_canary_observations_window", "window_id", "id"),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_id", String(12), primary_key=True),
    Column("secret_sha256", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("namespace", String(194), nullable=True),
    Column("holder", String(128), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("revoked_at", Timestamp, nullable=True),
    Column("revoked_by", String(128), nullable=True),
    Column("kind", String(8), nullable=False, server_default="person"),
    CheckConstraint("role IN ('training', 'signing', 'activation', 'admin', 'fleet')", name="ck_api_tokens_role"),
    Index("ix_api_tokens_holder", "holder", "role"),
)

signing_keys = Table(
    "signing_keys",
    metadata,
    Column("key_id", String(80), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("public_pem", Text, nullable=False),
    Column("holder", String(128), nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("revoked_at", Timestamp, nullable=True),
    Column("revoked_by", String(128), nullable=True),
    CheckConstraint("role IN ('training', 'signing', 'activation', 'admin')", name="ck_signing_keys_role"),
)

version_signatures = Table(
    "version_signatures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("version_id", String(64), ForeignKey("adapter_versions.version_id"), nullable=False),
    Column("key_id", String(80), ForeignKey("signing_keys.key_id"), nullable=False),
    Column("validation_run_id", Integer, ForeignKey("validation_runs.id"), nullable=False),
    Column("report_sha256", String(64), nullable=False),
    Column("signature", Text, nullable=False),
    Column("signed_at", Timestamp, nullable=False),
    Column("signed_by", String(128), nullable=False),
    UniqueConstraint("version_id", "key_id", "validation_run_id", name="uq_version_signatures_once"),
    Index("ix_version_signatures_version", "version_id", "id"),
)

approval_codes = Table(
    "approval_codes",
    metadata,
    Column("code_id", String(12), primary_key=True),
    Column("secret_sha256", String(64), nullable=False),
    Column("window_id", Integer, ForeignKey("canary_windows.id"), nullable=True),
    Column("version_id", String(64), ForeignKey("adapter_versions.version_id"), nullable=False),
    Column("adapter_name", String(194), nullable=False),
    Column("token_id", String(12), ForeignKey("api_tokens.token_id"), nullable=False),
    Column("reviewer", String(128), nullable=False),
    Column("decision", String(8), nullable=False),
    Column("issued_at", Timestamp, nullable=False),
    Column("expires_at", Timestamp, nullable=False),
    Column("used_at", Timestamp, nullable=True),
    Column("used_by", String(128), nullable=True),
    # a production move consumed it (the transaction's id: Postgres's trigger checks it)
    Column("applied_at", Timestamp, nullable=True),
    Column("applied_txid", BigInteger, nullable=True),
    CheckConstraint("decision IN ('approve', 'reject', 'rollback')", name="ck_approval_codes_decision"),
    Index("ix_approval_codes_window", "window_id"),
    Index("ix_approval_codes_version", "version_id"),
)
