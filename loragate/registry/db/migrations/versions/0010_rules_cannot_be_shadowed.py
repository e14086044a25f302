"""The database's rules cannot be shadowed or walked around; two more roles.

Postgres searches a session's temporary schema first for tables, and every role may create
temporary tables by default: a function that names ``pg_roles`` or ``stage_pointers``
unqualified, with the caller's search path, reads whatever the caller put there. So every
function the role model depends on now pins ``search_path`` to ``pg_catalog, pg_temp`` (the
temporary schema searched last, never for functions) and names every table by its schema;
and ``TEMPORARY`` on the registry's database is revoked from PUBLIC (the owner keeps it).
A stage pointer's DELETE is judged too: production is never deleted by a role's user, and
``previous`` only by the rollback that has just moved production onto it. Applying a sign-off
checks what using it checked: the code is still within its lifetime (counted from when it
was redeemed), its reviewer's token is not revoked, and its canary window still waits for
the sign-off. A code presented and refused is spent (``loragate_spend_approval_code``): the
secret that could have redeemed it, read by anyone from the orchestrator's stored input,
redeems nothing afterwards.

Two roles are added: ``fleet`` (the fleet pool's workers: replicas and reconcile, no tokens,
no keys, no sign-offs) and ``replica`` (a database user only, for vLLM replicas reading what
they may serve and what its bytes hash to: a few columns, no secrets, no writes).

Revision ID: 0010
Revises: 0009
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ROLES_0009 = ("training", "signing", "activation", "admin")
ROLES = (*ROLES_0009, "fleet")
PINNED = "SET search_path = pg_catalog, pg_temp"
PINNED_0009 = "SET search_path = public, pg_temp"
SHA256_HEX = "pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to({}, 'UTF8')), 'hex')"
A_LORAGATE_ROLE = " OR ".join(f"pg_catalog.pg_has_role(current_user, 'loragate_{r}', 'USAGE')" for r in ROLES)

# what the fleet pool's workers write, beyond reading everything and auditing
FLEET_GRANTS: tuple[str, ...] = (
    "INSERT ON replicas",  # fleet add, replicas up
    "DELETE ON replicas",  # fleet remove, replicas down
    # reconcile holds an adapter's row while it acts on the replicas for it, the lock a pointer
    # move keeps through its switch: the claim bumps the revision, rolled back when nothing moved
    "UPDATE (revision) ON adapters",
)
# what a replica reads to decide what it may serve and what its bytes must hash to
REPLICA_GRANTS: tuple[str, ...] = (
    "SELECT (id, name) ON adapters",
    "SELECT (version_id, adapter_id, stage, validation_status, weights_sha256, adapter_config_sha256, "
    "manifest_sha256) ON adapter_versions",
    "SELECT (adapter_id, stage, version_id) ON stage_pointers",
    "SELECT (version_id, decision, issued_at, used_at, applied_at, expires_at) ON approval_codes",
)

ISSUE_ARGS = (
    "p_code_id text, p_secret_sha256 text, p_window_id integer, p_version_id text, p_adapter_name text, "
    "p_decision text, p_ttl_s double precision, p_token_id text, p_token_secret text"
)
USE_ARGS = "p_code_id text, p_secret text, p_used_by text"
APPLY_ARGS = "p_version_id text, p_code_id text"
SPEND_ARGS = "p_code_id text, p_secret text, p_spent_by text"

ISSUE = f"""
CREATE OR REPLACE FUNCTION public.loragate_issue_approval_code({ISSUE_ARGS})
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE t public.api_tokens%ROWTYPE; issued timestamptz := now();
BEGIN
  SELECT * INTO t FROM public.api_tokens WHERE token_id = p_token_id;
  IF NOT FOUND OR t.secret_sha256 <> {SHA256_HEX.format("p_token_secret")} OR t.revoked_at IS NOT NULL
     OR t.role <> 'activation' OR t.kind <> 'person' THEN
    RAISE EXCEPTION 'an approval code is issued only to a person''s active activation token'
      USING ERRCODE = '42501';
  END IF;
  IF t.namespace IS NOT NULL AND p_adapter_name <> t.namespace AND NOT (right(t.namespace, 1) = '*'
     AND left(p_adapter_name, length(t.namespace) - 1) = left(t.namespace, length(t.namespace) - 1)) THEN
    RAISE EXCEPTION 'token % is limited to %', t.token_id, t.namespace USING ERRCODE = '42501';
  END IF;
  IF p_ttl_s < 30 OR p_ttl_s > 86400 THEN
    RAISE EXCEPTION 'an approval code lives 30 s to 24 h' USING ERRCODE = '22023';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM public.adapter_versions v JOIN public.adapters a ON a.id = v.adapter_id
                 WHERE v.version_id = p_version_id AND a.name = p_adapter_name) THEN
    RAISE EXCEPTION 'version % is not of %', p_version_id, p_adapter_name USING ERRCODE = '42501';
  END IF;
  IF p_window_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM public.canary_windows WHERE id = p_window_id
     AND version_id = p_version_id AND status = 'ready') THEN
    RAISE EXCEPTION 'canary window % of % is not waiting for a sign-off', p_window_id, p_version_id
      USING ERRCODE = '42501';
  END IF;
  INSERT INTO public.approval_codes (code_id, secret_sha256, window_id, version_id, adapter_name, token_id,
                                     reviewer, decision, issued_at, expires_at)
  VALUES (p_code_id, p_secret_sha256, p_window_id, p_version_id, p_adapter_name, t.token_id, t.holder,
          p_decision, issued, issued + make_interval(secs => p_ttl_s));
  RETURN issued;
END $$
"""

USE = f"""
CREATE OR REPLACE FUNCTION public.loragate_use_approval_code({USE_ARGS})
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE used timestamptz;
BEGIN
  UPDATE public.approval_codes c SET used_at = now(), used_by = left(p_used_by, 128)
   WHERE c.code_id = p_code_id AND c.used_at IS NULL AND c.expires_at > now()
     AND c.secret_sha256 = {SHA256_HEX.format("p_secret")}
     AND EXISTS (SELECT 1 FROM public.api_tokens t WHERE t.token_id = c.token_id AND t.revoked_at IS NULL)
  RETURNING c.used_at INTO used;
  RETURN used;
END $$
"""

# applicable: redeemed, not applied, within its lifetime counted from its redemption, its
# reviewer's token still active, its window (if any) still waiting for the sign-off
APPLY = f"""
CREATE OR REPLACE FUNCTION public.loragate_apply_approval({APPLY_ARGS})
RETURNS text LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE applied text;
BEGIN
  UPDATE public.approval_codes SET applied_at = now(), applied_txid = txid_current()
   WHERE applied_at IS NULL AND code_id = (
     SELECT c.code_id FROM public.approval_codes c
      WHERE c.version_id = p_version_id AND c.decision = 'approve'
        AND (p_code_id IS NULL OR c.code_id = p_code_id) AND c.used_at IS NOT NULL AND c.applied_at IS NULL
        AND now() < c.used_at + (c.expires_at - c.issued_at)
        AND EXISTS (SELECT 1 FROM public.api_tokens t WHERE t.token_id = c.token_id AND t.revoked_at IS NULL)
        AND (c.window_id IS NULL OR EXISTS (SELECT 1 FROM public.canary_windows w
                                            WHERE w.id = c.window_id AND w.status = 'ready'))
      ORDER BY c.used_at, c.code_id LIMIT 1 FOR UPDATE OF c)
  RETURNING code_id INTO applied;
  RETURN applied;
END $$
"""

# a code presented with its secret and refused, still unused: used and applied at once, by no
# move (no transaction id), so nothing can redeem or apply it afterwards. A code already used
# (a decision recorded with it) is left to the move that applies it. True when it was spent.
SPEND = f"""
CREATE FUNCTION public.loragate_spend_approval_code({SPEND_ARGS})
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER {PINNED} AS $$
DECLARE spent text;
BEGIN
  UPDATE public.approval_codes c SET used_at = now(), used_by = left(p_spent_by, 128), applied_at = now()
   WHERE c.code_id = p_code_id AND c.used_at IS NULL AND c.secret_sha256 = {SHA256_HEX.format("p_secret")}
  RETURNING c.code_id INTO spent;
  RETURN spent IS NOT NULL;
END $$
"""

# not SECURITY DEFINER: it asks which role the caller holds, and only reads
PRODUCTION_NEEDS_APPROVAL = f"""
CREATE OR REPLACE FUNCTION public.loragate_production_needs_approval() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
  -- the owner, and a superuser (who holds every role), are not limited
  IF NOT ({A_LORAGATE_ROLE})
     OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
    RETURN coalesce(NEW, OLD);
  END IF;
  IF TG_OP = 'DELETE' THEN
    -- production moves, it is never deleted; previous is dropped only by the rollback that
    -- has just moved production onto it
    IF OLD.stage = 'production' OR NOT pg_catalog.pg_has_role(current_user, 'loragate_activation', 'USAGE')
       OR NOT EXISTS (SELECT 1 FROM public.stage_pointers p WHERE p.adapter_id = OLD.adapter_id
                      AND p.stage = 'production' AND p.version_id = OLD.version_id) THEN
      RAISE EXCEPTION 'the % pointer is never deleted, only moved (previous: by a rollback)', OLD.stage
        USING ERRCODE = '42501';
    END IF;
    RETURN OLD;
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.version_id IS NOT DISTINCT FROM OLD.version_id THEN
    RETURN NEW;
  END IF;
  IF NEW.stage = 'previous' THEN
    IF NOT EXISTS (SELECT 1 FROM public.stage_pointers p WHERE p.adapter_id = NEW.adapter_id
                   AND p.stage = 'production' AND p.version_id = NEW.version_id) THEN
      RAISE EXCEPTION 'previous names only the version production serves when production moves'
        USING ERRCODE = '42501';
    END IF;
  ELSIF NOT EXISTS (SELECT 1 FROM public.adapter_versions v WHERE v.version_id = NEW.version_id
                    AND v.adapter_id = NEW.adapter_id)
     OR (NOT EXISTS (SELECT 1 FROM public.stage_pointers p WHERE p.adapter_id = NEW.adapter_id
                     AND p.stage = 'previous' AND p.version_id = NEW.version_id)
         AND NOT EXISTS (SELECT 1 FROM public.approval_codes c WHERE c.version_id = NEW.version_id
                         AND c.decision = 'approve' AND c.applied_txid = txid_current())) THEN
    RAISE EXCEPTION 'production moves to % only on a sign-off applied in its transaction, or back to previous',
      NEW.version_id USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END $$
"""


def _check_lifecycle(runs_table: str, pinned: str) -> str:
    """Migration 0003's lifecycle check, its transitions as 0003 froze them, reading
    ``runs_table``, with ``pinned`` (a SET clause, or nothing)."""
    at_0003 = _revision("0003_history_is_append_only.py")
    stages, validations = at_0003._pairs(at_0003.STAGE_TRANSITIONS), at_0003._pairs(at_0003.VALIDATION_TRANSITIONS)
    latest_run = f"(SELECT status FROM {runs_table} WHERE version_id = NEW.version_id ORDER BY id DESC LIMIT 1)"
    return (
        f"CREATE OR REPLACE FUNCTION loragate_check_lifecycle() RETURNS trigger {pinned} AS $$ BEGIN "
        "IF NEW.stage IS DISTINCT FROM OLD.stage "
        f"AND (OLD.stage, NEW.stage) NOT IN ({stages}) THEN "
        "RAISE EXCEPTION 'stage of version % cannot go from % to %', OLD.version_id, OLD.stage, NEW.stage; "
        "END IF; "
        "IF NEW.validation_status IS DISTINCT FROM OLD.validation_status THEN "
        f"IF (OLD.validation_status, NEW.validation_status) NOT IN ({validations}) THEN "
        "RAISE EXCEPTION 'validation_status of version % cannot go from % to %', "
        "OLD.version_id, OLD.validation_status, NEW.validation_status; "
        "END IF; "
        f"IF NEW.validation_status IS DISTINCT FROM {latest_run} THEN "
        "RAISE EXCEPTION 'validation_status of version % must be that of its latest validation run', "
        "OLD.version_id; "
        "END IF; "
        "END IF; "
        "RETURN NEW; END; $$ LANGUAGE plpgsql"
    )


# functions that name no table: pinning their search path is all they need
NO_TABLES = ("loragate_refuse_change()", "loragate_pointer_needs_role()")
ROLE_CHECK_SQLITE = "CHECK (role IN ({}))"


def _role_list(roles: tuple[str, ...]) -> str:
    return ", ".join(f"'{r}'" for r in roles)


def _create_role(name: str) -> None:
    # LOGIN without a password, as in 0006: pg_hba decides; production gives each a password
    op.execute(
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{name}') "
        f"THEN CREATE ROLE {name} LOGIN; END IF; END $$"
    )


def _drop_role_if_unused(name: str) -> None:
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{name}') AND NOT EXISTS ("
        f"SELECT FROM pg_catalog.pg_shdepend d JOIN pg_catalog.pg_roles r ON d.refobjid = r.oid "
        f"WHERE r.rolname = '{name}') THEN DROP ROLE {name}; END IF; END $$"
    )


# PUBLIC (grantee 0) still holds TEMPORARY on this database
PUBLIC_HAS_TEMPORARY = (
    "EXISTS (SELECT 1 FROM pg_catalog.pg_database d, "
    "pg_catalog.aclexplode(coalesce(d.datacl, pg_catalog.acldefault('d', d.datdba))) a "
    "WHERE d.datname = pg_catalog.current_database() AND a.grantee = 0 AND a.privilege_type = 'TEMPORARY')"
)
REVOKE_TEMPORARY = "REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC"
# what the error tells the owner to run: the name always quoted, as they will paste it
REVOKE_TEMPORARY_SHOWN = 'REVOKE TEMPORARY ON DATABASE "%s" FROM PUBLIC'


def _temporary(grant: bool) -> None:
    """TEMPORARY on this database for PUBLIC: only its owner (or a superuser) may change it.

    Revoking it is part of the rules (a temporary table would shadow what they read), so a
    migrating user that cannot revoke it while PUBLIC still holds it stops the migration,
    saying what to run and as whom; once done, migrating again goes on. Granting it back
    (a downgrade) is left as it is by anyone else: that only loosens.
    """
    if grant:
        op.execute(
            "DO $$ BEGIN IF pg_catalog.pg_has_role(current_user, (SELECT datdba FROM pg_catalog.pg_database "
            "WHERE datname = current_database()), 'USAGE') THEN EXECUTE pg_catalog.format("
            "'GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database()); END IF; END $$"
        )
        return
    op.execute(
        "DO $$ DECLARE db_owner name := (SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_catalog.pg_database "
        "WHERE datname = pg_catalog.current_database()); BEGIN "
        "IF pg_catalog.pg_has_role(current_user, db_owner, 'USAGE') THEN "
        f"EXECUTE pg_catalog.format('{REVOKE_TEMPORARY}', pg_catalog.current_database()); "
        f"ELSIF {PUBLIC_HAS_TEMPORARY} THEN "
        "RAISE EXCEPTION 'run % as the database owner (%) or a superuser, then migrate again: % may not revoke it, "
        "and while PUBLIC may create temporary tables every role could shadow the rules', "
        f"pg_catalog.format('{REVOKE_TEMPORARY_SHOWN}', "
        "pg_catalog.replace(pg_catalog.current_database(), '\"', '\"\"')), db_owner, current_user "
        "USING ERRCODE = '42501'; END IF; END $$"
    )


def _sqlite_role_check(old: tuple[str, ...], new: tuple[str, ...]) -> None:
    """Widen (or narrow back) api_tokens' role CHECK in place: SQLite cannot alter a
    constraint, and a copy of the table would break the approval codes that refer to it.
    Rewriting a CHECK's text is SQLite's documented way (its ALTER TABLE page, "other kinds
    of schema changes"); the rows' format does not change."""
    conn = op.get_bind()
    sql = str(
        conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'api_tokens'").scalar()
    )
    before, after = ROLE_CHECK_SQLITE.format(_role_list(old)), ROLE_CHECK_SQLITE.format(_role_list(new))
    if sql.count(before) != 1:
        raise RuntimeError(f"api_tokens' role check is not {before}: {sql}")
    version = int(conn.exec_driver_sql("PRAGMA schema_version").scalar() or 0)
    conn.exec_driver_sql("PRAGMA writable_schema = ON")
    conn.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'api_tokens'",
        (sql.replace(before, after),),
    )
    conn.exec_driver_sql(f"PRAGMA schema_version = {version + 1}")
    conn.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        _sqlite_role_check(ROLES_0009, ROLES)
        return
    op.execute("ALTER TABLE api_tokens DROP CONSTRAINT ck_api_tokens_role")
    op.execute(f"ALTER TABLE api_tokens ADD CONSTRAINT ck_api_tokens_role CHECK (role IN ({_role_list(ROLES)}))")
    for statement in (ISSUE, USE, APPLY, SPEND, PRODUCTION_NEEDS_APPROVAL):
        op.execute(statement)
    op.execute(_check_lifecycle("public.validation_runs", PINNED))
    for function in NO_TABLES:
        op.execute(f"ALTER FUNCTION public.{function} {PINNED}")
    op.execute(
        "CREATE TRIGGER stage_pointers_production_never_deleted BEFORE DELETE ON stage_pointers "
        "FOR EACH ROW WHEN (OLD.stage IN ('production', 'previous')) "
        "EXECUTE FUNCTION public.loragate_production_needs_approval()"
    )
    op.execute(f"REVOKE ALL ON FUNCTION public.loragate_spend_approval_code({SPEND_ARGS}) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION public.loragate_spend_approval_code({SPEND_ARGS}) TO loragate_activation")
    _temporary(grant=False)

    _create_role("loragate_fleet")
    op.execute("GRANT USAGE ON SCHEMA public TO loragate_fleet")
    op.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO loragate_fleet")
    op.execute("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO loragate_fleet")
    op.execute("GRANT INSERT ON audit_events TO loragate_fleet")
    for grant in FLEET_GRANTS:
        privilege, table = grant.split(" ON ")
        op.execute(f"GRANT {privilege} ON {table} TO loragate_fleet")

    _create_role("loragate_replica")
    op.execute("GRANT USAGE ON SCHEMA public TO loragate_replica")
    for grant in REPLICA_GRANTS:
        privilege, table = grant.split(" ON ")
        op.execute(f"GRANT {privilege} ON {table} TO loragate_replica")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        _sqlite_role_check(ROLES, ROLES_0009)
        return
    for name in ("loragate_replica", "loragate_fleet"):
        op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {name}")
        op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {name}")
        op.execute(f"REVOKE ALL ON SCHEMA public FROM {name}")
        _drop_role_if_unused(name)
    _temporary(grant=True)
    op.execute("DROP TRIGGER stage_pointers_production_never_deleted ON stage_pointers")
    op.execute(f"DROP FUNCTION public.loragate_spend_approval_code({SPEND_ARGS})")
    for function in NO_TABLES:
        op.execute(f"ALTER FUNCTION public.{function} RESET search_path")
    op.execute(_check_lifecycle("validation_runs", ""))
    # 0009's functions as they were: unqualified names, its search path
    before = _revision("0009_production_needs_a_person.py")
    for statement in (before.ISSUE, before.USE, before.APPLY, before.PRODUCTION_NEEDS_APPROVAL):
        op.execute(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    # a fleet token left makes this fail loudly: revoke and remove fleet tokens first
    op.execute("ALTER TABLE api_tokens DROP CONSTRAINT ck_api_tokens_role")
    op.execute(f"ALTER TABLE api_tokens ADD CONSTRAINT ck_api_tokens_role CHECK (role IN ({_role_list(ROLES_0009)}))")


def _revision(filename: str) -> ModuleType:
    """An earlier migration's module, for what it froze and the statements a downgrade restores."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"loragate_migration_{filename[:4]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
