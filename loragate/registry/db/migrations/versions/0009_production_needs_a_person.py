"""Production moves only on a person's sign-off, decided by the database too.

Tokens get a kind: ``person`` (the default) or ``pipeline`` (a work pool's). A pipeline
token is never issued an approval code, so whoever runs code on a pool's worker -- with its
token and its database credentials -- cannot approve its own move. Approval codes get
``applied_at``/``applied_txid``: a production move consumes one redeemed ``approve`` code
for the version it moves to (``registry/rules/approvals.py``).

On Postgres the rule holds for the loragate roles' database users as well, not only for the
application: ``activation`` no longer inserts or updates approval codes itself; three
SECURITY DEFINER functions do, each only with the secret that proves it -- issuing needs a
person's active activation token's secret (``loragate_issue_approval_code``), using needs the
code's secret (``loragate_use_approval_code``), and applying consumes one used approve code
for a version (``loragate_apply_approval``). A trigger then lets a role's user point
production at a version only when a code for it was applied in the same transaction, or
when it is the adapter's ``previous`` (a rollback); and ``previous`` only at the version
production serves when it moves. The owner (migrations, tests) is not limited.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ROLES = ("training", "signing", "activation", "admin")
ISSUED_COLUMNS_0007 = (
    "code_id, secret_sha256, window_id, version_id, adapter_name, token_id, reviewer, decision, issued_at, expires_at"
)
SHA256_HEX = "encode(sha256(convert_to({}, 'UTF8')), 'hex')"
A_LORAGATE_ROLE = " OR ".join(f"pg_has_role(current_user, 'loragate_{r}', 'USAGE')" for r in ROLES)
FUNCTIONS = {
    "loragate_issue_approval_code": (
        "p_code_id text, p_secret_sha256 text, p_window_id integer, p_version_id text, p_adapter_name text, "
        "p_decision text, p_ttl_s double precision, p_token_id text, p_token_secret text"
    ),
    "loragate_use_approval_code": "p_code_id text, p_secret text, p_used_by text",
    "loragate_apply_approval": "p_version_id text, p_code_id text",
}

ISSUE = f"""
CREATE FUNCTION loragate_issue_approval_code({FUNCTIONS["loragate_issue_approval_code"]})
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE t api_tokens%ROWTYPE; issued timestamptz := now();
BEGIN
  SELECT * INTO t FROM api_tokens WHERE token_id = p_token_id;
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
  IF NOT EXISTS (SELECT 1 FROM adapter_versions v JOIN adapters a ON a.id = v.adapter_id
                 WHERE v.version_id = p_version_id AND a.name = p_adapter_name) THEN
    RAISE EXCEPTION 'version % is not of %', p_version_id, p_adapter_name USING ERRCODE = '42501';
  END IF;
  IF p_window_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM canary_windows WHERE id = p_window_id
     AND version_id = p_version_id AND status = 'ready') THEN
    RAISE EXCEPTION 'canary window % of % is not waiting for a sign-off', p_window_id, p_version_id
      USING ERRCODE = '42501';
  END IF;
  INSERT INTO approval_codes ({ISSUED_COLUMNS_0007})
  VALUES (p_code_id, p_secret_sha256, p_window_id, p_version_id, p_adapter_name, t.token_id, t.holder,
          p_decision, issued, issued + make_interval(secs => p_ttl_s));
  RETURN issued;
END $$
"""

USE = f"""
CREATE FUNCTION loragate_use_approval_code({FUNCTIONS["loragate_use_approval_code"]})
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE used timestamptz;
BEGIN
  UPDATE approval_codes c SET used_at = now(), used_by = left(p_used_by, 128)
   WHERE c.code_id = p_code_id AND c.used_at IS NULL AND c.expires_at > now()
     AND c.secret_sha256 = {SHA256_HEX.format("p_secret")}
     AND EXISTS (SELECT 1 FROM api_tokens t WHERE t.token_id = c.token_id AND t.revoked_at IS NULL)
  RETURNING c.used_at INTO used;
  RETURN used;
END $$
"""

APPLY = f"""
CREATE FUNCTION loragate_apply_approval({FUNCTIONS["loragate_apply_approval"]})
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE applied text;
BEGIN
  UPDATE approval_codes SET applied_at = now(), applied_txid = txid_current()
   WHERE applied_at IS NULL AND code_id = (
     SELECT code_id FROM approval_codes WHERE version_id = p_version_id AND decision = 'approve'
        AND (p_code_id IS NULL OR code_id = p_code_id) AND used_at IS NOT NULL AND applied_at IS NULL
      ORDER BY used_at, code_id LIMIT 1 FOR UPDATE)
  RETURNING code_id INTO applied;
  RETURN applied;
END $$
"""

# not SECURITY DEFINER: it asks which role the caller holds, and only reads
PRODUCTION_NEEDS_APPROVAL = f"""
CREATE FUNCTION loragate_production_needs_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- the owner, and a superuser (who holds every role), are not limited
  IF NOT ({A_LORAGATE_ROLE}) OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    RETURN NEW;
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.version_id IS NOT DISTINCT FROM OLD.version_id THEN
    RETURN NEW;
  END IF;
  IF NEW.stage = 'previous' THEN
    IF NOT EXISTS (SELECT 1 FROM stage_pointers WHERE adapter_id = NEW.adapter_id AND stage = 'production'
                   AND version_id = NEW.version_id) THEN
      RAISE EXCEPTION 'previous names only the version production serves when production moves'
        USING ERRCODE = '42501';
    END IF;
  ELSIF NOT EXISTS (SELECT 1 FROM adapter_versions WHERE version_id = NEW.version_id
                    AND adapter_id = NEW.adapter_id)
     OR (NOT EXISTS (SELECT 1 FROM stage_pointers WHERE adapter_id = NEW.adapter_id AND stage = 'previous'
                     AND version_id = NEW.version_id)
         AND NOT EXISTS (SELECT 1 FROM approval_codes WHERE version_id = NEW.version_id
                         AND decision = 'approve' AND applied_txid = txid_current())) THEN
    RAISE EXCEPTION 'production moves to % only on a sign-off applied in its transaction, or back to previous',
      NEW.version_id USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END $$
"""


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("kind", sa.String(8), nullable=False, server_default="person"))
    op.add_column("approval_codes", sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("approval_codes", sa.Column("applied_txid", sa.BigInteger, nullable=True))
    op.create_index("ix_approval_codes_version", "approval_codes", ["version_id"])
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE api_tokens ADD CONSTRAINT ck_api_tokens_kind CHECK (kind IN ('person', 'pipeline'))")
    for statement in (ISSUE, USE, APPLY, PRODUCTION_NEEDS_APPROVAL):
        op.execute(statement)
    op.execute(
        "CREATE TRIGGER stage_pointers_production_needs_approval BEFORE INSERT OR UPDATE ON stage_pointers "
        "FOR EACH ROW WHEN (NEW.stage IN ('production', 'previous')) "
        "EXECUTE FUNCTION loragate_production_needs_approval()"
    )
    op.execute("REVOKE INSERT, UPDATE ON approval_codes FROM loragate_activation")
    for name, arguments in FUNCTIONS.items():
        op.execute(f"REVOKE ALL ON FUNCTION {name}({arguments}) FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {name}({arguments}) TO loragate_activation")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER stage_pointers_production_needs_approval ON stage_pointers")
        op.execute("DROP FUNCTION loragate_production_needs_approval()")
        for name, arguments in FUNCTIONS.items():
            op.execute(f"DROP FUNCTION {name}({arguments})")
        op.execute(f"GRANT INSERT ({ISSUED_COLUMNS_0007}) ON approval_codes TO loragate_activation")
        op.execute("GRANT UPDATE (used_at, used_by) ON approval_codes TO loragate_activation")
        op.execute("ALTER TABLE api_tokens DROP CONSTRAINT ck_api_tokens_kind")
    op.drop_index("ix_approval_codes_version", table_name="approval_codes")
    # plain ALTERs: batch mode would copy api_tokens, which approval_codes refers to
    op.execute("ALTER TABLE approval_codes DROP COLUMN applied_txid")
    op.execute("ALTER TABLE approval_codes DROP COLUMN applied_at")
    op.execute("ALTER TABLE api_tokens DROP COLUMN kind")
