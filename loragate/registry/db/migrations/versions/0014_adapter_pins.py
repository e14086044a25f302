"""Pinned adapters: the set every production replica keeps loaded in a slot, whatever its traffic.

``adapter_pins`` holds one row per pinned adapter: its name (an adapter the registry knows;
the row goes with the adapter), why it is pinned (``operator``: a person's ``loragate fleet
pin``; ``hot``: chosen from recent traffic by the traffic watch), who pinned it and when.
The replicas read the set with ``SELECT adapter_name FROM adapter_pins``.

On Postgres every loragate role reads it, as it reads every table; ``loragate_replica`` reads
its ``adapter_name`` column and nothing else of it. Writes:

- ``loragate_fleet`` (the traffic watch, on the fleet pool) inserts and deletes rows: the least
  that replacing the hot set takes (an insert that meets an existing pin does nothing, so it
  needs no UPDATE);
- ``loragate_admin`` (a person's role) inserts, deletes, and updates ``source``, ``pinned_by``
  and ``pinned_at``: a person's pin turns a hot pin into an operator pin in place;
- grants are per column, not per row: a trigger (search path pinned, as 0010 requires) lets no
  role's user but admin insert, change or delete an ``operator`` row, so the watch replaces
  hot pins and never touches a person's. The owner (and a superuser, who holds every role)
  is not limited, as in 0009-0012.

SQLite has no users: there only its owner writes, and the application holds the rule. The
downgrade drops the table, its trigger and function (and so every grant on it).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

ROLES = ("training", "signing", "activation", "admin", "fleet")
PINNED = "SET search_path = pg_catalog, pg_temp"
A_LORAGATE_ROLE = " OR ".join(f"pg_catalog.pg_has_role(current_user, 'loragate_{r}', 'USAGE')" for r in ROLES)
# the owner, and a superuser (who holds every role), are not limited
UNLIMITED = f"NOT ({A_LORAGATE_ROLE}) OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)"

# what each role's user writes, beyond reading every table and appending to the audit log
GRANTS: dict[str, tuple[str, ...]] = {
    "fleet": ("INSERT ON adapter_pins", "DELETE ON adapter_pins"),
    "admin": (
        "INSERT ON adapter_pins",
        "DELETE ON adapter_pins",
        "UPDATE (source, pinned_by, pinned_at) ON adapter_pins",
    ),
    # what a replica reads to pin them: the names, nothing else
    "replica": ("SELECT (adapter_name) ON adapter_pins",),
}

PIN_RULES = f"""
CREATE FUNCTION public.loragate_pin_rules() RETURNS trigger LANGUAGE plpgsql {PINNED} AS $$
BEGIN
  IF {UNLIMITED} OR pg_catalog.pg_has_role(current_user, 'loragate_admin', 'USAGE') THEN
    RETURN coalesce(NEW, OLD);
  END IF;
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    IF OLD.source IS DISTINCT FROM 'hot' THEN
      RAISE EXCEPTION 'the % pin of % is a person''s: only the admin role changes or removes it', OLD.source,
        OLD.adapter_name USING ERRCODE = '42501';
    END IF;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    IF NEW.source IS DISTINCT FROM 'hot' THEN
      RAISE EXCEPTION 'an adapter is pinned as % only by the admin role: % may pin hot adapters only', NEW.source,
        current_user USING ERRCODE = '42501';
    END IF;
  END IF;
  RETURN coalesce(NEW, OLD);
END $$
"""


def upgrade() -> None:
    op.create_table(
        "adapter_pins",
        sa.Column(
            "adapter_name",
            sa.String(194),
            sa.ForeignKey("adapters.name", ondelete="CASCADE", name="fk_adapter_pins_adapter"),
            primary_key=True,
        ),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("pinned_by", sa.String(128), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("source IN ('operator', 'hot')", name="ck_adapter_pins_source"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(PIN_RULES)
    op.execute(
        "CREATE TRIGGER adapter_pins_rules BEFORE INSERT OR UPDATE OR DELETE ON adapter_pins "
        "FOR EACH ROW EXECUTE FUNCTION public.loragate_pin_rules()"
    )
    # GRANT SELECT ON ALL TABLES (0006, 0010) covered only the tables of its time
    for role in ROLES:
        op.execute(f"GRANT SELECT ON adapter_pins TO loragate_{role}")
    for role, grants in GRANTS.items():
        for grant in grants:
            privilege, table = grant.split(" ON ")
            op.execute(f"GRANT {privilege} ON {table} TO loragate_{role}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER adapter_pins_rules ON adapter_pins")
        op.execute("DROP FUNCTION public.loragate_pin_rules()")
    # dropping the table drops every grant on it
    op.drop_table("adapter_pins")
