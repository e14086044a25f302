"""Who may send users where is decided by the database: canary windows and new versions are
written only under rules, a window's share has a cap, and each window has a bucket secret.

The production replicas send an adapter's users to the version of its active canary window,
as many as the window's share says. Until now any user that may move canary windows
(``signing``, ``activation``) could write such a window for any version and any share: a
machine credential could put every user on a version nobody validated, signed or signed off.
On Postgres a trigger now holds the loragate roles' users (the owner and a superuser, who run
migrations and hold every role, are not limited -- as in 0009/0010) to these rules:

- a window is inserted only as ``open``, only for the adapter's current ``canary`` pointer,
  a version of that adapter whose validation passed and that is signed over its latest
  validation run by an active ``signing`` key, with a share of at most the cap;
- its status moves only along the application's ``WINDOW_MOVES`` (frozen below, as 0003
  freezes the lifecycle): a closed window never becomes active again;
- its share changes only while it is open or ready, and is raised above the cap only by the
  ``activation`` user while a person's sign-off of the window's version is redeemed and not
  yet applied (or was applied in this very transaction): the promotion's own "every user to
  the canary first" step.

The cap is the operator's ``LORAGATE_CANARY_MAX_SHARE``; the database keeps its own copy in
``registry_limits`` (one row), which every role reads and only the owner writes --
``loragate init`` copies the setting there. A missing row reads as a cap of 0.

A new version enters as ``staging`` with validation ``pending`` whatever a role's user
writes (the lifecycle triggers of 0003 judge UPDATEs only; an INSERT could claim any stage).
SQLite has no users: only its owner writes it, and the application holds these rules there.

Each window gets ``bucket_key``, a random secret the replicas key each user's bucket with,
so a client cannot compute which version it will be given. On Postgres the database draws
it at INSERT, whatever the inserter wrote; on SQLite the application does. Only the
``replica`` user is granted it beyond the roles that already read everything.

Finally ``TEMPORARY`` on the database must be revoked from PUBLIC (0010): an install whose
migrating user could not revoke it -- it was silently skipped before -- fails here with the
statement to run as the database's owner.

Revision ID: 0012
Revises: 0011
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ROLES = ("training", "signing", "activation", "admin", "fleet")
PINNED = "SET search_path = pg_catalog, pg_temp"
A_LORAGATE_ROLE = " OR ".join(f"pg_catalog.pg_has_role(current_user, 'loragate_{r}', 'USAGE')" for r in ROLES)
# the owner, and a superuser (who holds every role), are not limited
UNLIMITED = f"NOT ({A_LORAGATE_ROLE}) OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)"
DEFAULT_CANARY_MAX_SHARE = 0.5

# frozen copy of loragate.registry.rules.canary.WINDOW_MOVES at this revision
WINDOW_MOVES = (
    ("open", "ready"),
    ("open", "rolled_back"),
    ("open", "superseded"),
    ("ready", "promoted"),
    ("ready", "rejected"),
    ("ready", "rolled_back"),
    ("ready", "superseded"),
    ("promoted", "rolled_back"),
)
MOVES = ", ".join(f"('{a}', '{b}')" for a, b in WINDOW_MOVES)
ACTIVE = "('open', 'ready')"
# two version-4 UUIDs (122 random bits each, from the server's strong random source), no dashes
RANDOM_HEX_64 = (
    "pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '') "
    "|| pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '')"
)
SQLITE_RANDOM_HEX_64 = "lower(hex(randomblob(32)))"

# a person's sign-off of the window's version that the promotion may still apply: what
# loragate_apply_approval (0010) would take, bound to this window or to none
SIGN_OFF_PENDING = """EXISTS (SELECT 1 FROM public.approval_codes c
  WHERE c.version_id = NEW.version_id AND c.decision = 'approve' AND (c.window_id IS NULL OR c.window_id = NEW.id)
    AND (c.applied_txid = pg_catalog.txid_current()
         OR (c.used_at IS NOT NULL AND c.applied_at IS NULL AND now() < c.used_at + (c.expires_at - c.issued_at)
             AND EXISTS (SELECT 1 FROM public.api_tokens t WHERE t.token_id = c.token_id AND t.revoked_at IS NULL))))"""

WINDOW_RULES = f"""
CREATE FUNCTION public.loragate_canary_window_rules() RETURNS trigger LANGUAGE plpgsql {PINNED} AS $$
DECLARE cap double precision := coalesce((SELECT l.canary_max_share FROM public.registry_limits l WHERE l.id = 1), 0);
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.bucket_key := {RANDOM_HEX_64};
  END IF;
  IF {UNLIMITED} THEN
    RETURN NEW;
  END IF;
  IF TG_OP = 'INSERT' THEN
    IF NEW.status IS DISTINCT FROM 'open' OR NEW.closed_at IS NOT NULL THEN
      RAISE EXCEPTION 'a canary window is opened as open, never as %', NEW.status USING ERRCODE = '42501';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.adapters a
                   JOIN public.stage_pointers p ON p.adapter_id = a.id AND p.stage = 'canary'
                   JOIN public.adapter_versions v ON v.version_id = p.version_id AND v.adapter_id = a.id
                   WHERE a.name = NEW.adapter_name AND p.version_id = NEW.version_id
                     AND v.validation_status = 'passed') THEN
      RAISE EXCEPTION 'a canary window of % is opened only for its canary, validated: % is not', NEW.adapter_name,
        NEW.version_id USING ERRCODE = '42501';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.version_signatures s JOIN public.signing_keys k ON k.key_id = s.key_id
                   WHERE s.version_id = NEW.version_id AND k.role = 'signing' AND k.revoked_at IS NULL
                     AND s.validation_run_id = (SELECT max(r.id) FROM public.validation_runs r
                                                WHERE r.version_id = NEW.version_id)) THEN
      RAISE EXCEPTION 'a canary window is opened only for a signed version: % has no signature by an active '
        'signing key over its latest validation', NEW.version_id USING ERRCODE = '42501';
    END IF;
    IF NEW.share > cap THEN
      RAISE EXCEPTION 'a canary window is opened with at most % of live requests (the cap), not %', cap, NEW.share
        USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
  END IF;
  IF NEW.status IS DISTINCT FROM OLD.status AND (OLD.status, NEW.status) NOT IN ({MOVES}) THEN
    RAISE EXCEPTION 'canary window % cannot go from % to %', OLD.id, OLD.status, NEW.status USING ERRCODE = '42501';
  END IF;
  IF NEW.share IS DISTINCT FROM OLD.share THEN
    IF OLD.status NOT IN {ACTIVE} OR NEW.status NOT IN {ACTIVE} THEN
      RAISE EXCEPTION 'canary window % is %: only an open or ready window has a share', OLD.id, NEW.status
        USING ERRCODE = '42501';
    END IF;
    IF NEW.share > cap AND NEW.share > OLD.share
       AND NOT (pg_catalog.pg_has_role(current_user, 'loragate_activation', 'USAGE') AND {SIGN_OFF_PENDING}) THEN
      RAISE EXCEPTION 'a canary share above % (the cap) takes the activation role and a person''s sign-off '
        'of %, redeemed and not yet applied', cap, NEW.version_id USING ERRCODE = '42501';
    END IF;
  END IF;
  RETURN NEW;
END $$
"""

ENTERS_STAGING = f"""
CREATE FUNCTION public.loragate_version_enters_staging() RETURNS trigger LANGUAGE plpgsql {PINNED} AS $$
BEGIN
  IF NOT ({UNLIMITED}) THEN
    NEW.stage := 'staging';
    NEW.validation_status := 'pending';
  END IF;
  RETURN NEW;
END $$
"""

# what a replica reads to key each user's bucket in a window
REPLICA_GRANTS: tuple[str, ...] = ("SELECT (bucket_key) ON canary_windows",)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "registry_limits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("canary_max_share", sa.Float, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_registry_limits_one_row"),
        sa.CheckConstraint(
            "canary_max_share >= 0 AND canary_max_share <= 1", name="ck_registry_limits_canary_max_share"
        ),
    )
    op.execute(f"INSERT INTO registry_limits (id, canary_max_share) VALUES (1, {DEFAULT_CANARY_MAX_SHARE})")
    if not postgres:
        # SQLite adds a NOT NULL column only with a default; every row gets its own key below
        op.execute("ALTER TABLE canary_windows ADD COLUMN bucket_key VARCHAR(64) NOT NULL DEFAULT ''")
        op.execute(f"UPDATE canary_windows SET bucket_key = {SQLITE_RANDOM_HEX_64}")
        return
    op.execute("ALTER TABLE canary_windows ADD COLUMN bucket_key VARCHAR(64)")
    op.execute(f"UPDATE canary_windows SET bucket_key = {RANDOM_HEX_64}")
    op.execute("ALTER TABLE canary_windows ALTER COLUMN bucket_key SET NOT NULL")
    op.execute(WINDOW_RULES)
    op.execute(
        "CREATE TRIGGER canary_windows_rules BEFORE INSERT OR UPDATE ON canary_windows "
        "FOR EACH ROW EXECUTE FUNCTION public.loragate_canary_window_rules()"
    )
    op.execute(ENTERS_STAGING)
    op.execute(
        "CREATE TRIGGER adapter_versions_enter_staging BEFORE INSERT ON adapter_versions "
        "FOR EACH ROW EXECUTE FUNCTION public.loragate_version_enters_staging()"
    )
    # GRANT SELECT ON ALL TABLES (0006, 0010) covered only the tables of its time
    for role in ROLES:
        op.execute(f"GRANT SELECT ON registry_limits TO loragate_{role}")
    for grant in REPLICA_GRANTS:
        privilege, table = grant.split(" ON ")
        op.execute(f"GRANT {privilege} ON {table} TO loragate_replica")
    # an install migrated by a user who could not revoke TEMPORARY (0010 skipped it then)
    _revision("0010_rules_cannot_be_shadowed.py")._temporary(grant=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for grant in REPLICA_GRANTS:
            privilege, table = grant.split(" ON ")
            op.execute(f"REVOKE {privilege} ON {table} FROM loragate_replica")
        op.execute("DROP TRIGGER adapter_versions_enter_staging ON adapter_versions")
        op.execute("DROP FUNCTION public.loragate_version_enters_staging()")
        op.execute("DROP TRIGGER canary_windows_rules ON canary_windows")
        op.execute("DROP FUNCTION public.loragate_canary_window_rules()")
    op.execute("ALTER TABLE canary_windows DROP COLUMN bucket_key")
    op.drop_table("registry_limits")


def _revision(filename: str) -> ModuleType:
    """An earlier migration's module, for the helper it defines."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"loragate_migration_{filename[:4]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
