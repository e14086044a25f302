"""Who may do what, and signatures: API tokens, signing keys, version signatures, and on
Postgres one database role per loragate role with least privilege.

The database roles repeat the application's separation for anyone who holds one role's
credentials: every role reads everything and appends to the audit log; ``training``
inserts versions, adapters and golden sets and moves no pointer; ``signing`` and
``activation`` move lifecycle columns and pointers; ``admin`` manages tokens, keys, bases
and the fleet. Nobody may UPDATE a version's content, DELETE a version, or UPDATE or
DELETE an audit event or a signature (grants here, triggers since 0001/0003 for the owner).
Grants are per column, so triggers decide which pointer a role's user may move: production
(and its previous) only ``activation``, the canary only ``signing``; users of none of the
four roles (the owner running migrations) are not limited. Roles are cluster-wide, so they
are created if missing and dropped on downgrade only when no other database still grants
them anything; CONNECT is left to PUBLIC's default (a per-database grant would not follow a
database cloned from a template).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
ROLES = ("training", "signing", "activation", "admin")
LIFECYCLE_MOVES = (
    "INSERT ON stage_pointers",
    "UPDATE (version_id, moved_at) ON stage_pointers",
    "DELETE ON stage_pointers",
    "UPDATE (revision) ON adapters",
    "INSERT ON canary_windows",
    "UPDATE (status, closed_at, reason, approval_flow_run_id) ON canary_windows",
    "INSERT ON canary_observations",
)
# frozen at this revision: what each role may write beyond reading everything and auditing
GRANTS: dict[str, tuple[str, ...]] = {
    "training": (
        "INSERT ON adapters",
        "UPDATE (revision) ON adapters",  # SELECT ... FOR UPDATE on the adapter row needs it
        "INSERT ON adapter_versions",
        "INSERT ON golden_sets",
    ),
    "signing": (
        *LIFECYCLE_MOVES,
        "UPDATE (stage, validation_status) ON adapter_versions",
        "INSERT ON validation_runs",
        "INSERT ON version_signatures",
    ),
    "activation": (*LIFECYCLE_MOVES, "UPDATE (stage) ON adapter_versions"),
    "admin": (
        "INSERT ON base_models",
        "INSERT ON replicas",
        "DELETE ON replicas",
        "INSERT ON api_tokens",
        "UPDATE (revoked_at, revoked_by) ON api_tokens",
        "INSERT ON signing_keys",
        "UPDATE (revoked_at, revoked_by) ON signing_keys",
    ),
}
APPEND_ONLY = ("version_signatures",)


def db_role(role: str) -> str:
    return f"loragate_{role}"


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(12), primary_key=True),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("namespace", sa.String(194), nullable=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", Timestamp, nullable=True),
        sa.Column("revoked_by", sa.String(128), nullable=True),
        sa.CheckConstraint(f"role IN ({', '.join(repr(r) for r in ROLES)})", name="ck_api_tokens_role"),
    )
    op.create_index("ix_api_tokens_holder", "api_tokens", ["holder", "role"])
    op.create_table(
        "signing_keys",
        sa.Column("key_id", sa.String(80), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("public_pem", sa.Text, nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", Timestamp, nullable=True),
        sa.Column("revoked_by", sa.String(128), nullable=True),
        sa.CheckConstraint(f"role IN ({', '.join(repr(r) for r in ROLES)})", name="ck_signing_keys_role"),
    )
    op.create_table(
        "version_signatures",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("version_id", sa.String(64), sa.ForeignKey("adapter_versions.version_id"), nullable=False),
        sa.Column("key_id", sa.String(80), sa.ForeignKey("signing_keys.key_id"), nullable=False),
        sa.Column("validation_run_id", sa.Integer, sa.ForeignKey("validation_runs.id"), nullable=False),
        sa.Column("report_sha256", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("signed_at", Timestamp, nullable=False),
        sa.Column("signed_by", sa.String(128), nullable=False),
        sa.UniqueConstraint("version_id", "key_id", "validation_run_id", name="uq_version_signatures_once"),
    )
    op.create_index("ix_version_signatures_version", "version_signatures", ["version_id", "id"])
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgres()
    else:
        for table in APPEND_ONLY:
            for event in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{event.lower()} BEFORE {event} ON {table} FOR EACH ROW "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )
        op.execute(
            "CREATE TRIGGER signing_keys_no_delete BEFORE DELETE ON signing_keys FOR EACH ROW "
            "BEGIN SELECT RAISE(ABORT, 'a signing key is revoked, never deleted'); END"
        )


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
        "CREATE TRIGGER signing_keys_never_deleted BEFORE DELETE ON signing_keys "
        "FOR EACH ROW EXECUTE FUNCTION loragate_refuse_change('a signing key (revoked, never deleted)')"
    )
    # grants are per column, not per row: which pointer moves is checked here -- production
    # and its previous only by activation, the canary only by signing
    op.execute(
        "CREATE FUNCTION loragate_pointer_needs_role() RETURNS trigger AS $$ BEGIN "
        "IF NOT pg_has_role(current_user, TG_ARGV[0], 'USAGE') AND (pg_has_role(current_user, "
        "'loragate_training', 'USAGE') OR pg_has_role(current_user, 'loragate_signing', 'USAGE') "
        "OR pg_has_role(current_user, 'loragate_activation', 'USAGE') "
        "OR pg_has_role(current_user, 'loragate_admin', 'USAGE')) THEN "
        "RAISE EXCEPTION 'moving % takes the % database role', TG_ARGV[1], TG_ARGV[0] "
        "USING ERRCODE = '42501'; END IF; RETURN NEW; END; $$ LANGUAGE plpgsql"
    )
    op.execute(
        "CREATE TRIGGER stage_pointers_production_by_activation BEFORE INSERT OR UPDATE ON stage_pointers "
        "FOR EACH ROW WHEN (NEW.stage IN ('production', 'previous')) "
        "EXECUTE FUNCTION loragate_pointer_needs_role('loragate_activation', 'production')"
    )
    op.execute(
        "CREATE TRIGGER adapter_versions_production_by_activation BEFORE UPDATE OF stage ON adapter_versions "
        "FOR EACH ROW WHEN (NEW.stage = 'production' AND OLD.stage IS DISTINCT FROM 'production') "
        "EXECUTE FUNCTION loragate_pointer_needs_role('loragate_activation', 'production')"
    )
    op.execute(
        "CREATE TRIGGER stage_pointers_canary_by_signing BEFORE INSERT OR UPDATE ON stage_pointers "
        "FOR EACH ROW WHEN (NEW.stage = 'canary') "
        "EXECUTE FUNCTION loragate_pointer_needs_role('loragate_signing', 'the canary')"
    )
    for role in ROLES:
        name = db_role(role)
        # LOGIN without a password: pg_hba decides; production gives each role a password
        op.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') "
            f"THEN CREATE ROLE {name} LOGIN; END IF; END $$"
        )
        op.execute(f"GRANT USAGE ON SCHEMA public TO {name}")
        op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}")
        op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {name}")
        op.execute(f"GRANT INSERT ON audit_events TO {name}")
        for grant in GRANTS[role]:
            privilege, table = grant.split(" ON ")
            op.execute(f"GRANT {privilege} ON {table} TO {name}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for role in ROLES:
            name = db_role(role)
            op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {name}")
            op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {name}")
            op.execute(f"REVOKE ALL ON SCHEMA public FROM {name}")
            # the role is the cluster's: drop it only when no other database still uses it
            op.execute(
                f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') AND NOT EXISTS ("
                f"SELECT FROM pg_shdepend d JOIN pg_roles r ON d.refobjid = r.oid WHERE r.rolname = '{name}'"
                f") THEN DROP ROLE {name}; END IF; END $$"
            )
        op.execute("DROP TRIGGER stage_pointers_canary_by_signing ON stage_pointers")
        op.execute("DROP TRIGGER adapter_versions_production_by_activation ON adapter_versions")
        op.execute("DROP TRIGGER stage_pointers_production_by_activation ON stage_pointers")
        op.execute("DROP FUNCTION loragate_pointer_needs_role()")
        op.execute("DROP TRIGGER signing_keys_never_deleted ON signing_keys")
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER {table}_no_truncate ON {table}")
            op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
    else:
        op.execute("DROP TRIGGER signing_keys_no_delete")
        for table in APPEND_ONLY:
            for event in ("update", "delete"):
                op.execute(f"DROP TRIGGER {table}_no_{event}")
    op.drop_index("ix_version_signatures_version", table_name="version_signatures")
    op.drop_table("version_signatures")
    op.drop_table("signing_keys")
    op.drop_index("ix_api_tokens_holder", table_name="api_tokens")
    op.drop_table("api_tokens")
