"""History cannot be rewritten in SQL: versions, their lineage and validation are append-only.

Whoever holds a connection: a version is never deleted or renamed; ``previous_version`` is
written once, at insert, and one linear chain per adapter is enforced by unique indexes;
``stage`` and ``validation_status`` only move along the lifecycle's transitions, and
``validation_status`` only to the status of the version's latest validation run; validation
runs, golden sets and pinned bases are append-only; an adapter's name never changes.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# frozen copies of loragate.registry.rules.lifecycle.ALLOWED and the validation transitions at this revision
STAGE_TRANSITIONS = (
    ("staging", "canary"),
    ("staging", "rejected"),
    ("canary", "production"),
    ("canary", "rolled_back"),
    ("canary", "retired"),
    ("production", "retired"),
    ("production", "rolled_back"),
    ("retired", "production"),
    ("retired", "canary"),
    ("rolled_back", "canary"),
)
VALIDATION_TRANSITIONS = (
    ("pending", "passed"),
    ("pending", "failed"),
    ("passed", "failed"),
    ("failed", "passed"),
)
APPEND_ONLY = ("validation_runs", "golden_sets", "base_models")


def _pairs(pairs: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"('{a}', '{b}')" for a, b in pairs)


LATEST_RUN = "(SELECT status FROM validation_runs WHERE version_id = NEW.version_id ORDER BY id DESC LIMIT 1)"


def upgrade() -> None:
    # one linear chain per adapter: no two versions name the same previous, one has none
    op.create_index(
        "uq_adapter_versions_previous",
        "adapter_versions",
        ["previous_version"],
        unique=True,
        sqlite_where=sa.text("previous_version IS NOT NULL"),
        postgresql_where=sa.text("previous_version IS NOT NULL"),
    )
    op.create_index(
        "uq_adapter_versions_first",
        "adapter_versions",
        ["adapter_id"],
        unique=True,
        sqlite_where=sa.text("previous_version IS NULL"),
        postgresql_where=sa.text("previous_version IS NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgres()
    else:
        _upgrade_sqlite()


def _upgrade_postgres() -> None:
    # loragate_refuse_change(what) exists since 0001
    for table in APPEND_ONLY:
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('{table} (append-only)')"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION loragate_refuse_change('{table} (append-only)')"
        )
    op.execute(
        "CREATE TRIGGER adapter_versions_never_deleted BEFORE DELETE ON adapter_versions "
        "FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('a version (never deleted)')"
    )
    op.execute(
        "CREATE TRIGGER adapter_versions_no_truncate BEFORE TRUNCATE ON adapter_versions "
        "FOR EACH STATEMENT EXECUTE FUNCTION loragate_refuse_change('a version (never deleted)')"
    )
    op.execute(
        "CREATE TRIGGER adapter_versions_identity BEFORE UPDATE OF version_id, previous_version "
        "ON adapter_versions FOR EACH ROW "
        "EXECUTE FUNCTION loragate_refuse_change('a version''s id and lineage (write-once)')"
    )
    op.execute(
        "CREATE TRIGGER adapters_identity BEFORE UPDATE OF name, namespace, base, task OR DELETE "
        "ON adapters FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('an adapter''s name')"
    )
    op.execute(
        "CREATE FUNCTION loragate_check_lifecycle() RETURNS trigger AS $$ BEGIN "
        "IF NEW.stage IS DISTINCT FROM OLD.stage "
        f"AND (OLD.stage, NEW.stage) NOT IN ({_pairs(STAGE_TRANSITIONS)}) THEN "
        "RAISE EXCEPTION 'stage of version % cannot go from % to %', OLD.version_id, OLD.stage, NEW.stage; "
        "END IF; "
        "IF NEW.validation_status IS DISTINCT FROM OLD.validation_status THEN "
        f"IF (OLD.validation_status, NEW.validation_status) NOT IN ({_pairs(VALIDATION_TRANSITIONS)}) THEN "
        "RAISE EXCEPTION 'validation_status of version % cannot go from % to %', "
        "OLD.version_id, OLD.validation_status, NEW.validation_status; "
        "END IF; "
        f"IF NEW.validation_status IS DISTINCT FROM {LATEST_RUN} THEN "
        "RAISE EXCEPTION 'validation_status of version % must be that of its latest validation run', "
        "OLD.version_id; "
        "END IF; "
        "END IF; "
        "RETURN NEW; END; $$ LANGUAGE plpgsql"
    )
    op.execute(
        "CREATE TRIGGER adapter_versions_lifecycle BEFORE UPDATE OF stage, validation_status "
        "ON adapter_versions FOR EACH ROW EXECUTE FUNCTION loragate_check_lifecycle()"
    )


def _refuse(name: str, event: str, table: str, message: str, when: str = "") -> None:
    condition = f" WHEN {when}" if when else ""
    op.execute(
        f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW{condition} "
        f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
    )


def _upgrade_sqlite() -> None:
    for table in APPEND_ONLY:
        _refuse(f"{table}_no_update", "UPDATE", table, f"{table} is append-only")
        _refuse(f"{table}_no_delete", "DELETE", table, f"{table} is append-only")
    _refuse("adapter_versions_never_deleted", "DELETE", "adapter_versions", "a version is never deleted")
    _refuse(
        "adapter_versions_identity",
        "UPDATE OF version_id, previous_version",
        "adapter_versions",
        "a version''s id and lineage are write-once",
    )
    _refuse("adapters_identity", "UPDATE OF name, namespace, base, task", "adapters", "an adapter''s name is immutable")
    _refuse("adapters_never_deleted", "DELETE", "adapters", "an adapter''s name is immutable")
    _refuse(
        "adapter_versions_stage",
        "UPDATE OF stage",
        "adapter_versions",
        "stage may only move along the lifecycle transitions",
        f"NEW.stage IS NOT OLD.stage AND (OLD.stage, NEW.stage) NOT IN (VALUES {_pairs(STAGE_TRANSITIONS)})",
    )
    _refuse(
        "adapter_versions_validation_status",
        "UPDATE OF validation_status",
        "adapter_versions",
        "validation_status may only move along its transitions, to the status of the latest validation run",
        "NEW.validation_status IS NOT OLD.validation_status AND ("
        f"(OLD.validation_status, NEW.validation_status) NOT IN (VALUES {_pairs(VALIDATION_TRANSITIONS)}) "
        f"OR NEW.validation_status IS NOT {LATEST_RUN})",
    )


SQLITE_TRIGGERS = (
    *(f"{t}_no_update" for t in APPEND_ONLY),
    *(f"{t}_no_delete" for t in APPEND_ONLY),
    "adapter_versions_never_deleted",
    "adapter_versions_identity",
    "adapters_identity",
    "adapters_never_deleted",
    "adapter_versions_stage",
    "adapter_versions_validation_status",
)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER adapter_versions_lifecycle ON adapter_versions")
        op.execute("DROP FUNCTION loragate_check_lifecycle()")
        op.execute("DROP TRIGGER adapters_identity ON adapters")
        op.execute("DROP TRIGGER adapter_versions_identity ON adapter_versions")
        op.execute("DROP TRIGGER adapter_versions_no_truncate ON adapter_versions")
        op.execute("DROP TRIGGER adapter_versions_never_deleted ON adapter_versions")
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER {table}_no_truncate ON {table}")
            op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
    else:
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {name}")
    op.drop_index("uq_adapter_versions_first", table_name="adapter_versions")
    op.drop_index("uq_adapter_versions_previous", table_name="adapter_versions")
